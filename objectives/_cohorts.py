"""Cohorts (overall, per class, per prompt-length, output-length and preemption-count bucket) with the same
status counts, latency tails, stalls and busy time.

Per-class p99s answer the SLO question; length buckets make a regression of long prompts or long answers visible
even when they are too few to move a class's p99; preemption-count buckets show what repeated preemption costs
the requests it hits.

A cohort is a boolean mask over the request table's rows; what every cohort reads is prepared once
(``CohortInputs``: the arrays, each latency and stall column sorted once), so a cohort costs a few masked sums
and no sort.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from objectives._busy import BusyTime
from objectives._censor import LATENCY_METRICS, LatencySamples
from objectives._percentile import SortedColumn, sorted_percentiles
from objectives._requests import RequestArrays
from objectives._tables import STATUSES
from sim.errors import ConfigError

NAN = float("nan")
#: Default prompt-length bucket edges (tokens); bucket i is ``[edges[i], edges[i+1])``.
DEFAULT_PROMPT_EDGES: tuple[float, ...] = (0, 512, 1024, 2048, 4096, 8192, math.inf)
#: Default output-length bucket edges (tokens of ``output_tokens_target``: what the request asks to generate).
DEFAULT_OUTPUT_EDGES: tuple[float, ...] = (0, 256, 1024, 4096, 16384, math.inf)
#: Preemption-count buckets: 0, 1, 2, 3-4, 5 or more.
PREEMPTION_EDGES: tuple[float, ...] = (0, 1, 2, 3, 5, math.inf)


@dataclass(frozen=True)
class Quantiles:
    """p50/p90/p99 by the sorted-index rule (``objectives._percentile``); NaN when unknown or empty.

    ``censored_share``: share of the cohort's requests whose value is censored (TTFT, E2E) or, for TPOT, that
    have no TPOT because they were lost before a second token.  ``attainment``: share of the cohort's requests
    meeting their class's target for this metric, lost requests counting as misses (NaN: no class of the cohort
    has a target for it)."""

    p50: float = NAN
    p90: float = NAN
    p99: float = NAN
    censored_share: float = NAN
    attainment: float = NAN


@dataclass(frozen=True)
class Tail:
    """p50/p90/p99/max of a per-request stall figure over the requests that have it (NaN: none has)."""

    p50: float = NAN
    p90: float = NAN
    p99: float = NAN
    max: float = NAN


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
    requests that finished within all their class's SLOs; ``preemptions_mean``: mean ``num_preemptions``;
    ``stalls``: per-request stall tails (``STALL_METRICS``); ``time``: its busy time by part."""

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
    stalls: dict[str, Tail] = field(default_factory=dict)
    time: BusyTime = BusyTime()


def prompt_edges(edges: Sequence[float] = DEFAULT_PROMPT_EDGES, name: str = "prompt_buckets") -> tuple[float, ...]:
    """Validated bucket edges, with 0 and ``inf`` added at the ends when missing so every request has a bucket."""
    out = [float(e) for e in edges]
    if not out or any(math.isnan(e) or e < 0 for e in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise ConfigError(name, f"edges must be non-negative and strictly increasing, got {list(edges)!r}")
    if out[0] > 0:
        out.insert(0, 0.0)
    if out[-1] != math.inf:
        out.append(math.inf)
    return tuple(out)


def bucket_label(low: float, high: float) -> str:
    """``"512-1024"``, ``"8192-inf"``: the bucket ``[low, high)`` in tokens."""
    return f"{_edge(low)}-{_edge(high)}"


def count_label(low: float, high: float) -> str:
    """Integer-count bucket ``[low, high)``: ``"0"``, ``"3-4"``, ``"5+"``."""
    if high == math.inf:
        return f"{low:g}+"
    return f"{low:g}" if high == low + 1 else f"{low:g}-{high - 1:g}"


def _edge(value: float) -> str:
    return "inf" if value == math.inf else f"{value:g}"


def buckets(values: np.ndarray, edges: Sequence[float], label=bucket_label) -> dict[str, np.ndarray]:
    """Bucket label -> boolean row mask, for every bucket (also empty ones, so summary keys are stable); a NaN
    value is in no bucket."""
    values = np.asarray(values, dtype="float64")
    with np.errstate(invalid="ignore"):
        return {label(lo, hi): (values >= lo) & (values < hi) for lo, hi in zip(edges, edges[1:])}


def prompt_buckets(table: RequestArrays, edges: Sequence[float]) -> dict[str, np.ndarray]:
    """Prompt-length buckets (``prompt_tokens``)."""
    return buckets(table.prompt, edges)


def output_buckets(table: RequestArrays, edges: Sequence[float] = DEFAULT_OUTPUT_EDGES) -> dict[str, np.ndarray]:
    """Output-length buckets (``output_tokens_target``)."""
    return buckets(table.output_target, edges)


def preemption_buckets(table: RequestArrays) -> dict[str, np.ndarray]:
    """Preemption-count buckets (``num_preemptions``; all empty when the table cannot tell)."""
    return buckets(table.preemptions, PREEMPTION_EDGES, count_label)


@dataclass(frozen=True)
class CohortInputs:
    """What every cohort reads, prepared once per summary: the request table's arrays, the censoring flags as
    floats, the SLO checks, and each latency and stall column sorted once (``SortedColumn``)."""

    table: RequestArrays
    finished: np.ndarray
    #: Finished and capped at max_model_len (None: the table cannot tell).
    capped: np.ndarray | None
    #: Rows that have a TPOT (a second token).
    tpot_applicable: np.ndarray
    #: Per latency metric, 1.0 on rows whose value is censored (TPOT: lost before a second token).
    censored: dict[str, np.ndarray]
    latency: dict[str, SortedColumn]
    stalls: dict[str, SortedColumn]
    checks: Mapping[str, np.ndarray]
    makespan_s: float
    transfer_per_block_s: float

    @classmethod
    def build(cls, table: RequestArrays, samples: LatencySamples, checks: Mapping[str, np.ndarray],
              makespan_s: float, transfer_per_block_s: float = NAN) -> "CohortInputs":
        """From the table's arrays, its latency samples and SLO checks (``_throughput.judge``)."""
        finished = table.finished
        applicable = samples.tpot_applicable.astype(bool)
        return cls(
            table=table,
            finished=finished,
            capped=finished & table.capped if table.capped is not None else None,
            tpot_applicable=applicable,
            censored={
                "ttft_s": samples.ttft_censored.astype(float),
                "tpot_s": (~applicable & samples.e2e_censored.astype(bool)).astype(float),
                "e2e_s": samples.e2e_censored.astype(float),
            },
            latency={m: SortedColumn(getattr(samples, m)) for m in LATENCY_METRICS},
            stalls={m: SortedColumn(v) for m, v in table.stalls.items()},
            checks=checks,
            makespan_s=makespan_s,
            transfer_per_block_s=transfer_per_block_s,
        )


def _tail(ascending: np.ndarray) -> Tail:
    known = ascending[~np.isnan(ascending)]
    if not known.size:
        return Tail()
    return Tail(*sorted_percentiles(known), float(known[-1]))


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else NAN


def _sum(values: np.ndarray) -> float:
    return float(values.sum())  # NaN propagates


def _attainment(met: np.ndarray) -> float:
    """Share of rows meeting a target among those judged against one (NaN: none is)."""
    judged = met[~np.isnan(met)]
    return float(judged.mean()) if judged.size else NAN


def cohort_stats(inputs: CohortInputs, rows: np.ndarray) -> CohortStats:
    """Stats of the requests selected by the boolean mask ``rows``."""
    rows = np.asarray(rows, dtype=bool)
    table = inputs.table
    by_code = np.bincount(table.status_codes[rows], minlength=len(table.status_labels))
    by_status = dict(zip(table.status_labels, by_code.tolist()))
    finished = rows & inputs.finished
    capped = int(np.count_nonzero(rows & inputs.capped)) if inputs.capped is not None else 0
    counts = StatusCounts(**{s: int(by_status.get(s, 0)) for s in STATUSES}, capped=capped)
    output = _sum(table.generated[finished])
    with_tpot = rows & inputs.tpot_applicable  # TPOT percentiles: the requests that have one
    latency = {
        m: Quantiles(*sorted_percentiles(inputs.latency[m].of(with_tpot if m == "tpot_s" else rows)),
                     censored_share=_mean(inputs.censored[m][rows]), attainment=_attainment(inputs.checks[m][rows]))
        for m in LATENCY_METRICS
    }
    good = _sum(inputs.checks["met"][rows])
    n = counts.total
    per_s = 1.0 / inputs.makespan_s if inputs.makespan_s > 0 else NAN
    moved = _sum(table.moved[rows])
    time = BusyTime(
        transfer_s=0.0 if moved == 0 else moved * inputs.transfer_per_block_s,
        **{f"{p}_s": _sum(v[rows]) for p, v in table.times.items()},
    )
    return CohortStats(
        counts=counts,
        output_tokens=output,
        output_tokens_per_s=output * per_s,
        goodput_rps=good * per_s,
        slo_attainment=good / n if n else NAN,
        preemptions_mean=_mean(table.preemptions[rows]) if n else NAN,
        recomputed_tokens=_sum(table.recomputed[rows]),
        stalls={m: _tail(column.of(rows)) for m, column in inputs.stalls.items()},
        time=time,
        **latency,
    )
