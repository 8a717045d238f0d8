"""Metrics of a run (request and step tables; docs/design.md, 'Data contracts' and 'Metrics') and the objectives
built on them.

``summarize`` is the entry point; the single metrics are exported for callers that need one of them.
Latency percentiles use one rule everywhere (``percentile``: sorted-index, numpy ``method="higher"``) and
count requests that did not finish as censored values (``latency_samples``), never dropping them.
"""

from objectives._censor import latency_samples
from objectives._busy import BusyTime
from objectives._cost import PRICE_KEY, deployment_price
from objectives._cohorts import DEFAULT_OUTPUT_EDGES, DEFAULT_PROMPT_EDGES, CohortStats, Quantiles, StatusCounts, Tail
from objectives._format import format_summary
from objectives._percentile import percentile, percentiles
from objectives._preemptions import PreemptionStats, preemption_stats
from objectives._steps import StepStats, StepTotals, kv_utilization, new_token_busy_share, recompute_token_share, step_stats
from objectives._summary import BUCKET_PREFIXES, Summary, summarize
from objectives._tables import STATUSES
from objectives._throughput import goodput_rps, makespan_s, output_tokens_per_s, slo_checks
from objectives.registry import (
    BoundConstraint,
    Constraint,
    Objective,
    constraint_values,
    get_objective,
    objective_names,
    parse_bound,
    register_objective,
    slo_constraints,
)

__all__ = [
    "BUCKET_PREFIXES",
    "PRICE_KEY",
    "DEFAULT_OUTPUT_EDGES",
    "DEFAULT_PROMPT_EDGES",
    "STATUSES",
    "BoundConstraint",
    "BusyTime",
    "CohortStats",
    "Constraint",
    "Objective",
    "PreemptionStats",
    "Quantiles",
    "StatusCounts",
    "StepStats",
    "StepTotals",
    "Tail",
    "Summary",
    "constraint_values",
    "deployment_price",
    "format_summary",
    "get_objective",
    "goodput_rps",
    "kv_utilization",
    "latency_samples",
    "makespan_s",
    "new_token_busy_share",
    "objective_names",
    "output_tokens_per_s",
    "parse_bound",
    "percentile",
    "percentiles",
    "preemption_stats",
    "recompute_token_share",
    "register_objective",
    "slo_checks",
    "slo_constraints",
    "step_stats",
    "summarize",
]
