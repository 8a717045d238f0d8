"""Workloads: real trace formats, request classes, and synthetic traffic fitted to traces.

Entry points: ``load_trace`` (any supported trace file), ``WorkloadSpec`` (the ``workload:`` section of a study
spec; ``from_dict`` then ``build``), ``fit_workload`` / ``generate`` (synthetic traffic from a fit),
``describe`` and ``write_trace``. The modules behind them are private.
"""

from sim.workload._arrivals import ARRIVAL_PROCESSES, ArrivalSpec, arrival_times, interarrival_cv
from sim.workload._detect import FORMATS, detect_format
from sim.workload._fit import describe, fit_workload
from sim.workload._generator import ClassTraffic, GeneratorSpec, generate
from sim.workload._lengths import Constant, Empirical, Lognormal, fit_lognormal
from sim.workload._loader import bundled_trace_path, load_trace
from sim.workload._report import LoadReport
from sim.workload._rules import ClassRule, ClassRules, Condition
from sim.workload._spec import TimeWindow, WorkloadSpec
from sim.workload._transform import cap_max_model_len, replace_arrivals
from sim.workload._writer import write_trace
from sim.workload.classes import DEFAULT_CLASS, SLO, RequestClass
from sim.workload.workload import WORKLOAD_COLUMNS, Workload

__all__ = [
    "ARRIVAL_PROCESSES",
    "ArrivalSpec",
    "ClassRule",
    "ClassRules",
    "ClassTraffic",
    "Condition",
    "Constant",
    "DEFAULT_CLASS",
    "Empirical",
    "FORMATS",
    "GeneratorSpec",
    "LoadReport",
    "Lognormal",
    "RequestClass",
    "SLO",
    "TimeWindow",
    "WORKLOAD_COLUMNS",
    "Workload",
    "WorkloadSpec",
    "arrival_times",
    "bundled_trace_path",
    "cap_max_model_len",
    "describe",
    "detect_format",
    "fit_lognormal",
    "fit_workload",
    "generate",
    "interarrival_cv",
    "load_trace",
    "replace_arrivals",
    "write_trace",
]
