"""``summarize``: every metric of one simulated or replayed run, as a typed record and a flat dict.

The flat dict is what ``kvtune simulate`` writes to summary.json and what Optuna trials store as user
attributes (each bucket family grouped into one, ``BUCKET_PREFIXES``); the objective registry reads values back
from it by key, so keys are stable across runs (every class of the spec and every bucket appears, also when empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from objectives._busy import BusyTime, transfer_per_block
from objectives._censor import LATENCY_METRICS, censor
from objectives._cohorts import (
    DEFAULT_OUTPUT_EDGES,
    DEFAULT_PROMPT_EDGES,
    CohortInputs,
    CohortStats,
    cohort_stats,
    output_buckets,
    preemption_buckets,
    prompt_buckets,
    prompt_edges,
)
from objectives._preemptions import PreemptionStats, preemption_stats_of
from objectives._requests import STALL_METRICS, RequestArrays
from objectives._steps import StepStats, StepTotals, step_stats
from objectives._throughput import judge, span_s
from sim.workload.classes import RequestClass

NAN = float("nan")

#: Key prefixes of the bucket-cohort families (``prompt.<low>-<high>.*``, ``output.<low>-<high>.*``,
#: ``preempted.<n>.*``): every ``Summary.cohort_groups()`` prefix but ``class``.  A study trial stores each family
#: under one user attribute (``optimizer._storage.metric_attrs``).
BUCKET_PREFIXES = ("prompt", "output", "preempted")


@dataclass(frozen=True)
class Summary:
    """Metrics of one run.  ``overall`` is the cohort of all requests (keys ``all.*``), ``classes`` one cohort
    per request class (``class.<name>.*``), ``prompt_buckets``/``output_buckets``/``preemption_buckets`` one per
    prompt-length, output-length and preemption-count bucket (``prompt.<low>-<high>.*``, ``output.<low>-<high>.*``,
    ``preempted.<n>.*``)."""

    makespan_s: float
    output_tokens_per_s: float
    goodput_rps: float
    overall: CohortStats
    classes: dict[str, CohortStats]
    prompt_buckets: dict[str, CohortStats]
    steps: StepStats = field(default_factory=StepStats)
    preemptions: PreemptionStats = field(default_factory=PreemptionStats)
    output_buckets: dict[str, CohortStats] = field(default_factory=dict)
    preemption_buckets: dict[str, CohortStats] = field(default_factory=dict)

    def cohort_groups(self) -> dict[str, dict[str, CohortStats]]:
        """Key prefix -> cohorts of that grouping (``class``, then the ``BUCKET_PREFIXES``)."""
        return {"class": self.classes, **dict(zip(BUCKET_PREFIXES, (self.prompt_buckets, self.output_buckets,
                                                                    self.preemption_buckets)))}

    def to_dict(self) -> dict[str, float | int]:
        """Flat ``{key: number}`` (NaN/inf kept as floats; Python's json writes them as NaN/Infinity)."""
        out: dict[str, float | int] = {
            "makespan_s": self.makespan_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput_rps": self.goodput_rps,
        }
        out.update({k: getattr(self.steps, k) for k in _field_names(StepStats) if k != "time"})
        out.update(self.steps.time.to_dict("time."))
        out["preemptions_total"] = self.preemptions.total
        out.update(_flatten("preemptions_per_request", self.preemptions, skip=("total",)))
        out.update(_cohort_keys("all", self.overall))
        for group, cohorts in self.cohort_groups().items():
            for label, stats in cohorts.items():
                out.update(_cohort_keys(f"{group}.{label}", stats))
        return out


def _flatten(prefix: str, record: object, skip: Sequence[str] = ()) -> dict[str, float | int]:
    return {f"{prefix}.{k}": getattr(record, k) for k in _field_names(type(record)) if k not in skip}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The dataclass's field names, in order (``dataclasses.asdict``'s keys; its values here are numbers)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _cohort_keys(prefix: str, stats: CohortStats) -> dict[str, float | int]:
    out = _flatten(f"{prefix}.count", stats.counts)
    out[f"{prefix}.count.total"] = stats.counts.total
    for metric in LATENCY_METRICS:
        out.update(_flatten(f"{prefix}.{metric}", getattr(stats, metric)))
    for metric in STALL_METRICS:
        out.update(_flatten(f"{prefix}.{metric}", stats.stalls.get(metric)))
    for name in ("output_tokens", "output_tokens_per_s", "goodput_rps", "slo_attainment", "recomputed_tokens"):
        out[f"{prefix}.{name}"] = getattr(stats, name)
    out[f"{prefix}.preemptions_per_request.mean"] = stats.preemptions_mean
    time: BusyTime = stats.time
    out.update(time.to_dict(f"{prefix}.time."))
    out[f"{prefix}.new_token_busy_share"] = time.new_token_busy_share
    out[f"{prefix}.recompute_busy_share"] = time.recompute_busy_share
    return out


def summarize(
    requests: pd.DataFrame,
    steps: "pd.DataFrame | StepTotals | None",
    classes: Mapping[str, RequestClass],
    prompt_bucket_edges: Sequence[float] = DEFAULT_PROMPT_EDGES,
    output_bucket_edges: Sequence[float] = DEFAULT_OUTPUT_EDGES,
) -> Summary:
    """All metrics of a run from its request and step tables (docs/design.md, 'Data contracts') and its class
    definitions.

    ``steps`` may be ``None`` when a backend has no step table: the step metrics are then NaN; or the
    :class:`~objectives.StepTotals` a run accumulated instead of keeping its step table.
    Raises ``ConfigError`` for missing columns, unknown statuses, or rows of an undefined class.
    """
    edges = prompt_edges(prompt_bucket_edges)
    out_edges = prompt_edges(output_bucket_edges, "output_buckets")
    table = RequestArrays.of(requests)
    samples = censor(table, classes, steps)
    checks = judge(table.finished, table.class_is, vars(samples), classes)  # (the samples' arrays by name)
    span = span_s(table.end, table.arrival)
    stats = step_stats(steps)
    inputs = CohortInputs.build(table, samples, checks, span, transfer_per_block(table.moved, stats.time))

    def cohort(rows: np.ndarray) -> CohortStats:
        return cohort_stats(inputs, rows)

    overall = cohort(np.ones(len(table), dtype=bool))
    return Summary(
        makespan_s=span,
        output_tokens_per_s=overall.output_tokens / span if span > 0 else NAN,
        goodput_rps=overall.goodput_rps,
        overall=overall,
        classes={name: cohort(table.class_is(name)) for name in classes},
        prompt_buckets={label: cohort(rows) for label, rows in prompt_buckets(table, edges).items()},
        output_buckets={label: cohort(rows) for label, rows in output_buckets(table, out_edges).items()},
        preemption_buckets={label: cohort(rows) for label, rows in preemption_buckets(table).items()},
        steps=stats,
        preemptions=preemption_stats_of(table.preemptions),
    )
