"""``kvtune report``: one self-contained HTML page (and PNG images of its charts) for a stored study.

    from optimizer.report import write_report
    result = write_report(spec, out="runs/incident/report")          # reads the spec's default storage

The page answers the operator's questions in order: what the recommended config gains over the default one per
class (p99 E2E, timed-out requests, recompute share, throughput), the Pareto front with both configs marked,
per-class p99 against throughput, recompute and new-token busy share per trial, a timeline of KV usage, queue and
preemptions for both configs (re-simulated), and the tail by cohort including timed-out and cancelled requests.
``--whatif`` adds the same two configs re-simulated on other hardware or knob values.

Names are imported lazily (pandas, Optuna, plotting load on first use), so that building the CLI stays cheap.
"""

from __future__ import annotations

from sim import lazy_getattr

_EXPORTS = {
    "build_charts": "optimizer.report._figures",
    "Chart": "optimizer.report._figures",
    "ConfigRun": "optimizer.report._data",
    "find_browser": "optimizer.report._images",
    "gather": "optimizer.report._data",
    "render_page": "optimizer.report._page",
    "ReportData": "optimizer.report._data",
    "ReportResult": "optimizer.report._write",
    "Sweep": "optimizer.report._data",
    "timeline_frame": "optimizer.report._figures",
    "translate_flavor": "optimizer.report._data",
    "WhatIf": "optimizer.report._data",
    "write_report": "optimizer.report._write",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
