"""The report page in a real browser: headless Chromium loads report.html from disk (no network), every chart
draws its SVG, no script error is raised, and a full-page screenshot is saved.

Needs the Debian ``chromium`` package (``apt-get install -y chromium``); skipped with that reason without it.
Set ``KVTUNE_ARTIFACTS=<dir>`` to keep the screenshot and the DOM dump.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from optimizer.report import find_browser

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="headless Chromium is not installed (Debian: apt-get install -y chromium); "
                            "the browser check of the HTML report needs it")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]


def _chromium(args: list[str], profile: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [BROWSER, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _console_errors(stderr: str) -> list[str]:
    """Console messages of level error and uncaught exceptions from ``--enable-logging=stderr --v=0``."""
    out = []
    for line in stderr.splitlines():
        if ":CONSOLE" in line and (":ERROR:" in line or "Uncaught" in line):
            out.append(line)
        elif "Uncaught" in line:
            out.append(line)
    return out


@pytest.fixture(scope="module")
def rendered(written_report, tmp_path_factory):
    """The DOM after plotly ran (virtual time lets every chart finish) and chromium's console log."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    url = written_report.html.resolve().as_uri()
    proc = _chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom", url], profile)
    assert proc.returncode == 0, proc.stderr[-2000:]
    artifacts = os.environ.get("KVTUNE_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / "report.dom.html").write_text(proc.stdout)
    return {"dom": proc.stdout, "stderr": proc.stderr, "charts": written_report.charts}


def test_every_chart_rendered(rendered):
    dom = rendered["dom"]
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None
    attrs = body.group(1)
    assert 'data-errors="0"' in attrs, attrs
    assert f'data-plots="{len(rendered["charts"])}"' in attrs, attrs
    for chart in rendered["charts"]:
        start = dom.find(f'id="chart-{chart}"')
        assert start >= 0, f"chart {chart} missing from the DOM"
        nxt = dom.find('id="chart-', start + 10)
        section = dom[start: nxt if nxt > 0 else len(dom)]
        assert "plot-container" in section, f"chart {chart}: plotly did not draw it"
        assert section.count('class="main-svg"') >= 2, f"chart {chart}: no SVG drawn"


def test_no_console_errors(rendered):
    errors = _console_errors(rendered["stderr"])
    assert not errors, "\n".join(errors[:10])


def test_screenshot(written_report, tmp_path):
    shot = tmp_path / "report.png"
    proc = _chromium(["--virtual-time-budget=10000", "--window-size=1400,3000", f"--screenshot={shot}",
                      written_report.html.resolve().as_uri()], tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 50_000  # a blank page is a few KB
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = os.environ.get("KVTUNE_ARTIFACTS")
    if artifacts:
        shutil.copy(shot, Path(artifacts) / "report-screenshot.png")


def test_png_images_of_the_charts(tuned_study, tmp_path):
    """kaleido renders one PNG per chart through the same browser."""
    pytest.importorskip("kaleido", reason="PNG export needs kaleido (pip install kaleido, the 'report' extra)")
    from optimizer.report import write_report

    result = write_report(tuned_study["spec"], out=tmp_path, storage=tuned_study["storage"],
                          context=tuned_study["ctx"], png=True)
    assert result.image_error is None, result.image_error
    assert sorted(p.name for p in result.images) == sorted(f"{c}.png" for c in result.charts)
    for path in result.images:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "images/pareto.png" in (tmp_path / "report.json").read_text()
