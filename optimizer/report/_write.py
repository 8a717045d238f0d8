"""``write_report``: gather a stored study's data, build the charts, write the page, its JSON and PNGs."""


from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from optimizer.report._data import ReportData, Sweep, WhatIf, gather
from optimizer.report._figures import build_charts
from optimizer.report._images import ImageExport, write_pngs
from optimizer.report._page import metrics_document, render_page

__all__ = ["ReportResult", "write_report"]


@dataclass
class ReportResult:
    """What ``write_report`` wrote."""

    out: Path
    html: Path
    json: Path
    images: list[Path] = field(default_factory=list)
    image_error: str | None = None
    charts: list[str] = field(default_factory=list)
    data: ReportData | None = None
    wall_s: float = 0.0

    def summary(self) -> str:
        lines = [f"wrote {self.html} ({len(self.charts)} charts: {', '.join(self.charts)})"]
        if self.images:
            lines.append(f"wrote {len(self.images)} PNG images to {self.images[0].parent}")
        if self.image_error:
            lines.append(f"no PNG images: {self.image_error}")
        d = self.data
        if d is not None and d.default is not None and d.recommended is not None and d.default.ok and d.recommended.ok:
            dm, rm = d.default.metrics, d.recommended.metrics
            lines.append(f"default vs recommended: output {dm.get('output_tokens_per_s', float('nan')):.1f} -> "
                         f"{rm.get('output_tokens_per_s', float('nan')):.1f} tok/s, recompute share "
                         f"{100 * dm.get('recompute_busy_share', float('nan')):.2f}% -> "
                         f"{100 * rm.get('recompute_busy_share', float('nan')):.2f}%")
            for name in d.ctx.classes:
                key = f"class.{name}.e2e_s.p99"
                lines.append(f"  class {name}: p99 E2E {dm.get(key, float('nan')):.2f} -> {rm.get(key, float('nan')):.2f} s, "
                             f"timed out {int(dm.get(f'class.{name}.count.timed_out', 0))} -> "
                             f"{int(rm.get(f'class.{name}.count.timed_out', 0))}")
        return "\n".join(lines)


def write_report(spec: Any, *, out: str | Path, storage: str | None = None, study_out: str | Path | None = None,
                 favor: str | None = None, whatifs: Sequence[WhatIf | str] = (), whatif_trials: str = "picked",
                 sweeps: Sequence[Sweep | str] = (), png: bool = True, context: Any = None, command: str | None = None) -> ReportResult:
    """Write ``report.html``, ``report.json`` and ``images/<chart>.png`` for the spec's stored study to ``out``.

    ``spec``: a :class:`~optimizer._spec.StudySpec` or a path to its YAML.  ``storage`` / ``study_out``: where the
    study is (as for ``kvtune export``).  ``favor``: pick the Pareto point best for this class.  ``whatifs``:
    overrides (``"gpu=H200"``, ``"kv_cache_dtype=fp8"``) under which the default and recommended configs are
    simulated again (``whatif_trials="all"``: every complete trial too).  ``sweeps``: ``"max_num_seqs=64,128,256"``
    sets one knob to each value on top of the default and the recommended config.
    """
    from optimizer._spec import StudySpec, load_study_spec
    from optimizer._storage import open_study, prepare
    from sim.errors import ConfigError
    from sim.outputs import atomic_write_text, probe_out_dir

    t0 = time.perf_counter()
    out = probe_out_dir(out)  # before the work: a folder that cannot be written fails at once
    if not isinstance(spec, StudySpec):
        spec = load_study_spec(spec)
    if whatif_trials not in ("picked", "all"):
        raise ConfigError("--whatif-trials", f"must be picked or all, got {whatif_trials!r}")
    parsed = [w if isinstance(w, WhatIf) else WhatIf.parse(w) for w in whatifs]
    parsed_sweeps = [s if isinstance(s, Sweep) else Sweep.parse(s) for s in sweeps]
    url = spec.storage_url(storage, spec.out_dir(study_out))
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise ConfigError("storage", f"{url} does not exist; run 'kvtune tune' first or give --storage / --study-out")
    ctx = context or prepare(spec)
    study = open_study(ctx, url, create=False)
    trials = study.get_trials(deepcopy=False)
    data = gather(spec, ctx, trials, url, favor=favor, whatifs=parsed, whatif_trials=whatif_trials,
                  sweeps=parsed_sweeps)
    charts = build_charts(data)
    images = ImageExport(error="PNG export turned off (--no-png)")
    if png and charts:
        images = write_pngs(charts, out / "images")
    image_note = f"PNG images of the charts were not written: {images.error}" if images.error and png else None
    html_path = out / "report.html"
    atomic_write_text(html_path, render_page(data, charts, command=command, image_note=image_note))
    json_path = out / "report.json"
    doc = metrics_document(data, [str(p.relative_to(out)) for p in images.files], images.error)
    doc["charts"] = [c.id for c in charts]
    atomic_write_text(json_path, json.dumps(doc, indent=1) + "\n")
    return ReportResult(out, html_path, json_path, images.files, images.error, [c.id for c in charts], data,
                        time.perf_counter() - t0)
