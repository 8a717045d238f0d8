"""PNG images of the charts, through kaleido (plotly's static export), which drives a headless Chrome/Chromium.

kaleido 1.x finds a system Chromium (Debian package ``chromium``) by itself; with none installed, and no network
to fetch one, export fails: the report is still written and says so (``ImageExport.error``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from optimizer.report._figures import Chart

#: Width of every PNG, in CSS pixels (height: the chart's own).
PNG_WIDTH = 1400
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


@dataclass
class ImageExport:
    files: list[Path] = field(default_factory=list)
    error: str | None = None


def find_browser() -> str | None:
    """A Chrome or Chromium executable on PATH (or ``BROWSER_PATH``), else ``None``."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).exists():
        return env
    for name in _BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def write_pngs(charts: Sequence[Chart], folder: Path) -> ImageExport:
    """``<folder>/<chart id>.png`` for every chart; one browser session for all of them."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import kaleido  # noqa: F401
        import plotly.io as pio
    except ImportError as exc:
        return ImageExport(error=f"PNG export needs kaleido ({exc}); pip install kaleido")
    browser = find_browser()
    if browser is None:
        return ImageExport(error="PNG export needs Chrome or Chromium (kaleido drives it); none found on PATH. "
                                 "Install one, e.g. apt-get install -y chromium")
    os.environ.setdefault("BROWSER_PATH", browser)
    paths = [folder / f"{c.id}.png" for c in charts]
    try:
        if hasattr(pio, "write_images"):
            pio.write_images([c.figure for c in charts], paths, format="png", width=PNG_WIDTH,
                             height=[c.height for c in charts])
        else:  # older plotly: one call (and one browser start) per chart
            for chart, path in zip(charts, paths):
                chart.figure.write_image(path, format="png", width=PNG_WIDTH, height=chart.height)
    except Exception as exc:  # kaleido/browser failures vary by version; the HTML report stands without PNGs
        return ImageExport(files=[p for p in paths if p.exists()],
                           error=f"PNG export failed ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
    return ImageExport(files=paths)
