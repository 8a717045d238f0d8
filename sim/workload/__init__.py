"""Workloads: real trace formats, request classes, and synthetic traffic fitted to traces.

Entry points: ``load_trace`` (any supported trace file), ``WorkloadSpec`` (the ``workload:`` section of a study
spec; ``from_dict`` then ``build``), ``fit_workload`` / ``generate`` (synthetic traffic from a fit),
``describe`` and ``write_trace``. The modules behind them are private.
Names are imported lazily (the readers load pandas), so that ``import sim.workload.cli`` stays cheap.
"""

from __future__ import annotations

from sim._lazy import lazy_getattr

_EXPORTS = {
    "ARRIVAL_PROCESSES": "sim.workload._arrivals",
    "arrival_times": "sim.workload._arrivals",
    "ArrivalSpec": "sim.workload._arrivals",
    "bundled_trace_path": "sim.workload._loader",
    "cap_max_model_len": "sim.workload._transform",
    "ClassRule": "sim.workload._rules",
    "ClassRules": "sim.workload._rules",
    "ClassTraffic": "sim.workload._generator",
    "Condition": "sim.workload._rules",
    "Constant": "sim.workload._lengths",
    "DEFAULT_CLASS": "sim.workload.classes",
    "check_format": "sim.workload._detect",
    "describe": "sim.workload._fit",
    "detect_format": "sim.workload._detect",
    "Empirical": "sim.workload._lengths",
    "fit_lognormal": "sim.workload._lengths",
    "fit_workload": "sim.workload._fit",
    "FORMATS": "sim.workload._detect",
    "generate": "sim.workload._generator",
    "GeneratorSpec": "sim.workload._generator",
    "interarrival_cv": "sim.workload._arrivals",
    "load_trace": "sim.workload._loader",
    "LoadReport": "sim.workload._report",
    "Lognormal": "sim.workload._lengths",
    "replace_arrivals": "sim.workload._transform",
    "RequestClass": "sim.workload.classes",
    "SLO": "sim.workload.classes",
    "TimeWindow": "sim.workload._spec",
    "Workload": "sim.workload.workload",
    "WORKLOAD_COLUMNS": "sim.workload.workload",
    "WorkloadSpec": "sim.workload._spec",
    "write_trace": "sim.workload._writer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
