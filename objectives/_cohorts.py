"""Cohorts (overall, per class, per prompt-length, output-length and preemption-count bucket) with the same
status counts, latency tails, stalls and busy time.

Per-class p99s answer the SLO question; length buckets make a regression of long prompts or long answers visible
even when they are too few to move a class's p99; preemption-count buckets show what repeated preemption costs
the requests it hits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from objectives._busy import BusyTime, blocks_moved
from objectives._censor import LATENCY_METRICS
from objectives._percentile import percentiles
from objectives._tables import FINISHED, STATUSES, column, optional_column
from sim.errors import ConfigError
from sim.latency import PART_NAMES

NAN = float("nan")
#: Default prompt-length bucket edges (tokens); bucket i is ``[edges[i], edges[i+1])``.
DEFAULT_PROMPT_EDGES: tuple[float, ...] = (0, 512, 1024, 2048, 4096, 8192, math.inf)
#: Default output-length bucket edges (tokens of ``output_tokens_target``: what the request asks to generate).
DEFAULT_OUTPUT_EDGES: tuple[float, ...] = (0, 256, 1024, 4096, 16384, math.inf)
#: Preemption-count buckets: 0, 1, 2, 3-4, 5 or more.
PREEMPTION_EDGES: tuple[float, ...] = (0, 1, 2, 3, 5, math.inf)
#: Per-request stall columns summarized per cohort (request table, ``sim.tables``).
STALL_METRICS: tuple[str, ...] = ("max_itl_s", "preempted_s", "queue_wait_s", "resume_wait_s")


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


def buckets(values: pd.Series, edges: Sequence[float], label=bucket_label) -> dict[str, pd.Series]:
    """Bucket label -> boolean row mask, for every bucket (also empty ones, so summary keys are stable)."""
    return {label(lo, hi): values.ge(lo) & values.lt(hi) for lo, hi in zip(edges, edges[1:])}


def prompt_buckets(requests: pd.DataFrame, edges: Sequence[float]) -> dict[str, pd.Series]:
    """Prompt-length buckets (``prompt_tokens``)."""
    return buckets(column(requests, "prompt_tokens"), edges)


def output_buckets(requests: pd.DataFrame, edges: Sequence[float] = DEFAULT_OUTPUT_EDGES) -> dict[str, pd.Series]:
    """Output-length buckets (``output_tokens_target``)."""
    return buckets(optional_column(requests, "output_tokens_target"), edges)


def preemption_buckets(requests: pd.DataFrame) -> dict[str, pd.Series]:
    """Preemption-count buckets (``num_preemptions``; all empty when the table cannot tell)."""
    return buckets(column(requests, "num_preemptions"), PREEMPTION_EDGES, count_label)


@dataclass(frozen=True)
class CohortInputs:
    """The request table's columns every cohort reads, as numpy arrays (built once per summary; a cohort is a
    boolean mask over them)."""

    status: np.ndarray
    generated: np.ndarray
    preemptions: np.ndarray
    recomputed: np.ndarray
    samples: dict[str, np.ndarray]
    checks: dict[str, np.ndarray]
    stalls: dict[str, np.ndarray]
    times: dict[str, np.ndarray]
    moved: np.ndarray
    makespan_s: float
    transfer_per_block_s: float
    #: Finished at max_model_len before the output target (the simulator's ``capped`` column; None: unknown).
    capped: np.ndarray | None = None

    @classmethod
    def build(cls, requests: pd.DataFrame, samples: pd.DataFrame, checks: pd.DataFrame, makespan_s: float,
              transfer_per_block_s: float = NAN) -> "CohortInputs":
        """From the request table, its ``latency_samples`` and ``slo_checks`` (same index)."""
        preemptions = column(requests, "num_preemptions").to_numpy()
        stalls = {m: optional_column(requests, m).to_numpy() for m in STALL_METRICS}
        with np.errstate(invalid="ignore"):
            stalls["resume_wait_s"] = np.where(preemptions > 0, stalls["resume_wait_s"], np.nan)  # preempted only
        return cls(
            status=requests["status"].astype(str).to_numpy(),
            generated=column(requests, "generated_tokens").to_numpy(),
            preemptions=preemptions,
            recomputed=column(requests, "recomputed_tokens").to_numpy(),
            samples={c: samples[c].to_numpy() for c in samples.columns},
            checks={c: checks[c].to_numpy() for c in checks.columns},
            stalls=stalls,
            times={p: optional_column(requests, f"time_{p}_s").to_numpy() for p in PART_NAMES if p != "transfer"},
            moved=blocks_moved(requests).to_numpy(),
            makespan_s=makespan_s,
            transfer_per_block_s=transfer_per_block_s,
            capped=requests["capped"].to_numpy(dtype=bool) if "capped" in requests.columns else None,
        )


def _quantiles(values: np.ndarray, censored: float, attainment: float) -> Quantiles:
    return Quantiles(*percentiles(values), censored, attainment)


def _tail(values: np.ndarray) -> Tail:
    known = values[~np.isnan(values)]
    if not known.size:
        return Tail()
    return Tail(*percentiles(known), float(known.max()))


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
    status = inputs.status[rows]
    names, counts_ = np.unique(status, return_counts=True)
    by_status = dict(zip(names.tolist(), counts_.tolist()))
    finished = rows & (inputs.status == FINISHED)
    capped = int((finished & inputs.capped).sum()) if inputs.capped is not None else 0
    counts = StatusCounts(**{s: int(by_status.get(s, 0)) for s in STATUSES}, capped=capped)
    output = _sum(inputs.generated[finished])
    smp = inputs.samples
    applicable = smp["tpot_applicable"].astype(bool)
    censored = {
        "ttft_s": _mean(smp["ttft_censored"][rows].astype(float)),
        "tpot_s": _mean((~applicable & smp["e2e_censored"].astype(bool))[rows].astype(float)),
        "e2e_s": _mean(smp["e2e_censored"][rows].astype(float)),
    }
    latency = {
        m: _quantiles(smp[m][rows & applicable] if m == "tpot_s" else smp[m][rows], censored[m],
                      _attainment(inputs.checks[m][rows]))
        for m in LATENCY_METRICS
    }
    good = _sum(inputs.checks["met"][rows])
    n = counts.total
    per_s = 1.0 / inputs.makespan_s if inputs.makespan_s > 0 else NAN
    moved = _sum(inputs.moved[rows])
    time = BusyTime(
        transfer_s=0.0 if moved == 0 else moved * inputs.transfer_per_block_s,
        **{f"{p}_s": _sum(v[rows]) for p, v in inputs.times.items()},
    )
    return CohortStats(
        counts=counts,
        output_tokens=output,
        output_tokens_per_s=output * per_s,
        goodput_rps=good * per_s,
        slo_attainment=good / n if n else NAN,
        preemptions_mean=_mean(inputs.preemptions[rows]) if n else NAN,
        recomputed_tokens=_sum(inputs.recomputed[rows]),
        stalls={m: _tail(v[rows]) for m, v in inputs.stalls.items()},
        time=time,
        **latency,
    )
