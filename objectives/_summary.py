"""``summarize``: every metric of one simulated or replayed run, as a typed record and a flat dict.

The flat dict is what ``kvtune simulate`` writes to summary.json and what Optuna trials store as user
attributes; the objective registry reads values back from it by key, so keys are stable across runs (every
class of the spec and every prompt bucket appears, also when empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from objectives._censor import latency_samples
from objectives._cohorts import DEFAULT_PROMPT_EDGES, CohortStats, cohort_stats, prompt_buckets, prompt_edges
from objectives._preemptions import PreemptionStats, preemption_stats
from objectives._steps import StepStats, StepTotals, step_stats
from objectives._throughput import finished_output_tokens, makespan_s, slo_met
from sim.workload.classes import RequestClass

NAN = float("nan")


@dataclass(frozen=True)
class Summary:
    """Metrics of one run.  ``overall`` is the cohort of all requests (keys ``all.*``), ``classes`` one cohort
    per request class (``class.<name>.*``), ``prompt_buckets`` one per prompt-length bucket
    (``prompt.<low>-<high>.*``)."""

    makespan_s: float
    output_tokens_per_s: float
    goodput_rps: float
    overall: CohortStats
    classes: dict[str, CohortStats]
    prompt_buckets: dict[str, CohortStats]
    steps: StepStats = field(default_factory=StepStats)
    preemptions: PreemptionStats = field(default_factory=PreemptionStats)

    def to_dict(self) -> dict[str, float | int]:
        """Flat ``{key: number}`` (NaN/inf kept as floats; Python's json writes them as NaN/Infinity)."""
        out: dict[str, float | int] = {
            "makespan_s": self.makespan_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput_rps": self.goodput_rps,
        }
        out.update(dataclasses.asdict(self.steps))
        out["preemptions_total"] = self.preemptions.total
        out.update(_flatten("preemptions_per_request", self.preemptions, skip=("total",)))
        out.update(_cohort_keys("all", self.overall))
        for name, stats in self.classes.items():
            out.update(_cohort_keys(f"class.{name}", stats))
        for label, stats in self.prompt_buckets.items():
            out.update(_cohort_keys(f"prompt.{label}", stats))
        return out


def _flatten(prefix: str, record: object, skip: Sequence[str] = ()) -> dict[str, float | int]:
    return {f"{prefix}.{k}": v for k, v in dataclasses.asdict(record).items() if k not in skip}


def _cohort_keys(prefix: str, stats: CohortStats) -> dict[str, float | int]:
    out = _flatten(f"{prefix}.count", stats.counts)
    out[f"{prefix}.count.total"] = stats.counts.total
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        out.update(_flatten(f"{prefix}.{metric}", getattr(stats, metric)))
    for name in ("output_tokens", "output_tokens_per_s", "goodput_rps", "slo_attainment", "recomputed_tokens"):
        out[f"{prefix}.{name}"] = getattr(stats, name)
    out[f"{prefix}.preemptions_per_request.mean"] = stats.preemptions_mean
    return out


def summarize(
    requests: pd.DataFrame,
    steps: "pd.DataFrame | StepTotals | None",
    classes: Mapping[str, RequestClass],
    prompt_bucket_edges: Sequence[float] = DEFAULT_PROMPT_EDGES,
) -> Summary:
    """All metrics of a run from its request and step tables (DESIGN section 3) and its class definitions.

    ``steps`` may be ``None`` when a backend has no step table: the step metrics are then NaN; or the
    :class:`~objectives.StepTotals` a run accumulated instead of keeping its step table.
    Raises ``ConfigError`` for missing columns, unknown statuses, or rows of an undefined class.
    """
    edges = prompt_edges(prompt_bucket_edges)
    samples = latency_samples(requests, classes, steps)
    met = slo_met(requests, samples, classes)
    span = makespan_s(requests)
    names = requests["class"].astype(str)

    def cohort(rows: pd.Series) -> CohortStats:
        return cohort_stats(requests, samples, met, rows, span)

    everyone = pd.Series(True, index=requests.index)
    overall = cohort(everyone)
    return Summary(
        makespan_s=span,
        output_tokens_per_s=finished_output_tokens(requests) / span if span > 0 else NAN,
        goodput_rps=overall.goodput_rps,
        overall=overall,
        classes={name: cohort(names.eq(name)) for name in classes},
        prompt_buckets={label: cohort(rows) for label, rows in prompt_buckets(requests, edges).items()},
        steps=step_stats(steps),
        preemptions=preemption_stats(requests),
    )
