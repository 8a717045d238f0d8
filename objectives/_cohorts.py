"""Cohorts (overall, per class, per prompt-length bucket) with the same status counts and latency tails.

Per-class p99s answer the SLO question; prompt-length buckets make a regression of long requests visible
even when they are too few to move a class's p99.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from objectives._censor import LATENCY_METRICS
from objectives._percentile import percentiles
from objectives._tables import FINISHED, STATUSES, column
from sim.errors import ConfigError

NAN = float("nan")
#: Default prompt-length bucket edges (tokens); bucket i is ``[edges[i], edges[i+1])``.
DEFAULT_PROMPT_EDGES: tuple[float, ...] = (0, 512, 1024, 2048, 4096, 8192, math.inf)


@dataclass(frozen=True)
class Quantiles:
    """p50/p90/p99 by the sorted-index rule (``objectives._percentile``); NaN when unknown or empty."""

    p50: float = NAN
    p90: float = NAN
    p99: float = NAN


@dataclass(frozen=True)
class StatusCounts:
    """Requests of the cohort by final status."""

    finished: int = 0
    timed_out: int = 0
    cancelled: int = 0
    rejected: int = 0
    unfinished: int = 0
    #: Of the finished ones, those the engine stopped at max_model_len before their output target.
    capped: int = 0

    @property
    def total(self) -> int:
        return self.finished + self.timed_out + self.cancelled + self.rejected + self.unfinished


@dataclass(frozen=True)
class CohortStats:
    """One cohort.  Latencies include censored requests (see ``objectives._censor``).  ``output_tokens``:
    new tokens of its finished requests; rates are over the run's makespan; ``slo_attainment``: share of its
    requests that finished within their class's SLOs; ``preemptions_mean``: mean ``num_preemptions``."""

    counts: StatusCounts
    ttft_s: Quantiles
    tpot_s: Quantiles
    e2e_s: Quantiles
    output_tokens: float
    output_tokens_per_s: float
    goodput_rps: float
    slo_attainment: float
    preemptions_mean: float
    recomputed_tokens: float


def prompt_edges(edges: Sequence[float] = DEFAULT_PROMPT_EDGES) -> tuple[float, ...]:
    """Validated bucket edges, with 0 and ``inf`` added at the ends when missing so every request has a bucket."""
    out = [float(e) for e in edges]
    if not out or any(math.isnan(e) or e < 0 for e in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise ConfigError("prompt_buckets", f"edges must be non-negative and strictly increasing, got {list(edges)!r}")
    if out[0] > 0:
        out.insert(0, 0.0)
    if out[-1] != math.inf:
        out.append(math.inf)
    return tuple(out)


def bucket_label(low: float, high: float) -> str:
    """``"512-1024"``, ``"8192-inf"``: the bucket ``[low, high)`` in tokens."""
    return f"{_edge(low)}-{_edge(high)}"


def _edge(value: float) -> str:
    return "inf" if value == math.inf else f"{value:g}"


def prompt_buckets(requests: pd.DataFrame, edges: Sequence[float]) -> dict[str, pd.Series]:
    """Bucket label -> boolean row mask, for every bucket (also empty ones, so summary keys are stable)."""
    prompt = column(requests, "prompt_tokens")
    return {bucket_label(lo, hi): prompt.ge(lo) & prompt.lt(hi) for lo, hi in zip(edges, edges[1:])}


def _quantiles(values: pd.Series) -> Quantiles:
    return Quantiles(*percentiles(values.to_numpy(dtype="float64")))


def cohort_stats(
    requests: pd.DataFrame, samples: pd.DataFrame, met: pd.Series, rows: pd.Series, makespan_s: float
) -> CohortStats:
    """Stats of the requests selected by the boolean mask ``rows`` (``samples``/``met`` share the index)."""
    status = requests.loc[rows, "status"].astype(str)
    by_status = status.value_counts()
    finished = rows & requests["status"].astype(str).eq(FINISHED)
    capped = int((finished & requests["capped"].astype(bool)).sum()) if "capped" in requests.columns else 0
    counts = StatusCounts(**{s: int(by_status.get(s, 0)) for s in STATUSES}, capped=capped)
    output = float(column(requests, "generated_tokens")[finished].sum(skipna=False))
    latency = {
        m: _quantiles(samples.loc[rows & samples["tpot_applicable"], m] if m == "tpot_s" else samples.loc[rows, m])
        for m in LATENCY_METRICS
    }
    good = float(met[rows].sum(skipna=False))
    n = counts.total
    per_s = 1.0 / makespan_s if makespan_s > 0 else NAN
    return CohortStats(
        counts=counts,
        output_tokens=output,
        output_tokens_per_s=output * per_s,
        goodput_rps=good * per_s,
        slo_attainment=good / n if n else NAN,
        preemptions_mean=float(column(requests, "num_preemptions")[rows].mean(skipna=False)) if n else NAN,
        recomputed_tokens=float(column(requests, "recomputed_tokens")[rows].sum(skipna=False)),
        **latency,
    )

