"""Step-table metrics: how busy the GPU was, what its busy time served, KV use and inter-token latency.

A step row may stand for a run of ``num_steps`` identical iterations; its ``duration_s`` and token columns
are already totals of the run, so they are summed as they are (never multiplied by ``num_steps``).
A NaN in a column a metric reads makes that metric NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from objectives._busy import STEP_TIME_COLUMNS, BusyTime, busy_from_steps
from objectives._percentile import weighted_percentiles
from objectives._tables import STEP_COLUMNS, column, require_columns
from sim.latency import PART_NAMES

NAN = float("nan")


@dataclass(frozen=True)
class StepStats:
    """Engine-side totals over the whole run.

    ``busy_s``: sum of ``duration_s``; ``busy_fraction``: busy_s over the span from the first step's start to
    the last step's end (how much of the time the GPU was stepping).  Time shares (``objectives._busy``):
    ``new_token_busy_share`` = (new prefill + decode time) / busy_s, ``recompute_busy_share`` = recompute time /
    busy_s.  Token shares: ``recompute_token_share`` = recomputed prefill tokens / all tokens processed,
    ``new_token_token_share`` = (new prefill + decode tokens) / all tokens.  ``kv_utilization``: mean of
    ``kv_blocks_used / kv_blocks_total`` over steps weighted by ``duration_s``.  ``itl_s_p*``: inter-token
    latency of running decodes, each decode token weighted once with its step's time (a run of decode steps at
    its mean step time); gaps from preemption stalls are in the request table's ``max_itl_s``, not here.
    """

    busy_s: float = NAN
    busy_fraction: float = NAN
    num_steps: float = NAN
    tokens_new: float = NAN
    tokens_recompute: float = NAN
    new_token_busy_share: float = NAN
    recompute_busy_share: float = NAN
    new_token_token_share: float = NAN
    recompute_token_share: float = NAN
    kv_utilization: float = NAN
    kv_utilization_peak: float = NAN
    swap_out_blocks: float = NAN
    swap_in_blocks: float = NAN
    itl_s_p50: float = NAN
    itl_s_p90: float = NAN
    itl_s_p99: float = NAN
    time: BusyTime = BusyTime()


def _total(values: pd.Series) -> float:
    return float(values.sum(skipna=False))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else NAN  # NaN den compares False: NaN


def recompute_token_share(steps: pd.DataFrame) -> float:
    """Recomputed prefill tokens over all tokens processed (see ``StepStats``)."""
    return step_stats(steps).recompute_token_share


def new_token_busy_share(steps: pd.DataFrame) -> float:
    """Share of busy GPU time that served new tokens, by the time parts (see ``StepStats``)."""
    return step_stats(steps).new_token_busy_share


def kv_utilization(steps: pd.DataFrame) -> float:
    """Duration-weighted mean KV block utilisation (see ``StepStats``)."""
    return step_stats(steps).kv_utilization


def _itl_pairs(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per decode step (or run), its time per step and its decode tokens: the weighted samples of the ITL."""
    decode = column(steps, "decode_tokens")
    per_step = column(steps, "duration_s") / column(steps, "num_steps").where(lambda n: n > 0)
    rows = (decode > 0).to_numpy()
    return per_step.to_numpy()[rows], decode.to_numpy()[rows]


@dataclass
class _Partial:
    """What the step metrics need from some rows: totals, extremes and the ITL samples.  Partials of consecutive
    chunks merge (:meth:`merge`) into the partial of their concatenation, so a run's step metrics can be
    accumulated without keeping its rows.  Sums merge by adding (the same values as one sum up to float
    rounding); the ITL samples are kept exactly, as (value, weight) pairs with equal values merged."""

    rows: int = 0
    busy_s: float = 0.0
    num_steps: float = 0.0
    tokens_new: float = 0.0
    tokens_recompute: float = 0.0
    tokens_all: float = 0.0
    kv_weighted: float = 0.0
    swap_out_blocks: float = 0.0
    swap_in_blocks: float = 0.0
    #: ``start_s`` in every chunk (the span needs it), its min and the max of ``start_s + duration_s``.
    has_start: bool = True
    start_min: float = math.inf
    end_max: float = -math.inf
    #: Highest KV share of a step; any NaN makes it NaN (pandas' ``max(skipna=False)``); -inf: no rows yet.
    kv_peak: float = -math.inf
    #: Sums of the ``time_*_s`` parts (``None``: some chunk had no parts, so they are unknown).
    parts: tuple[float, ...] | None = (0.0,) * len(STEP_TIME_COLUMNS)
    itl_values: list = field(default_factory=list)
    itl_weights: list = field(default_factory=list)
    _itl_pending: int = 0

    @classmethod
    def of(cls, steps: pd.DataFrame) -> "_Partial":
        require_columns(steps, STEP_COLUMNS, "steps")
        duration = column(steps, "duration_s")
        new = column(steps, "prefill_tokens_new") + column(steps, "decode_tokens")
        recompute = column(steps, "prefill_tokens_recompute")
        kv = column(steps, "kv_blocks_used") / column(steps, "kv_blocks_total").where(lambda t: t > 0)
        part = cls(rows=len(steps), busy_s=_total(duration), num_steps=_total(column(steps, "num_steps")),
                   tokens_new=_total(new), tokens_recompute=_total(recompute), tokens_all=_total(new + recompute),
                   kv_weighted=_total(duration * kv), swap_out_blocks=_total(column(steps, "swap_out_blocks")),
                   swap_in_blocks=_total(column(steps, "swap_in_blocks")), has_start="start_s" in steps.columns)
        if len(steps):
            part.kv_peak = float(kv.max(skipna=False))
            if part.has_start:
                start = column(steps, "start_s")
                part.start_min = float(start.min())
                part.end_max = float((start + duration).max())
            values, weights = _itl_pairs(steps)
            part.itl_values, part.itl_weights, part._itl_pending = [values], [weights], len(values)
        if set(STEP_TIME_COLUMNS) <= set(steps.columns):
            time = busy_from_steps(steps)
            part.parts = tuple(getattr(time, f"{p}_s") for p in PART_NAMES)
        else:
            part.parts = None
        return part

    def merge(self, other: "_Partial") -> None:
        for name in ("rows", "busy_s", "num_steps", "tokens_new", "tokens_recompute", "tokens_all", "kv_weighted",
                     "swap_out_blocks", "swap_in_blocks"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.has_start = self.has_start and other.has_start
        self.start_min = float(np.fmin(self.start_min, other.start_min))  # a chunk of NaN ends has NaN: skipped
        self.end_max = float(np.fmax(self.end_max, other.end_max))
        self.kv_peak = float(np.maximum(self.kv_peak, other.kv_peak))  # (NaN wins, as in the whole table)
        self.parts = None if self.parts is None or other.parts is None else tuple(
            a + b for a, b in zip(self.parts, other.parts))
        self.itl_values += other.itl_values
        self.itl_weights += other.itl_weights
        self._itl_pending += other._itl_pending
        if self._itl_pending >= _ITL_COMPACT_AT:
            self._compact()

    def _compact(self) -> None:
        """Merge equal ITL values (their weights summed): exact, and steps of the same batch shape repeat."""
        values, weights = self.itl()
        if np.isnan(values).any():  # every weight is > 0, so the percentiles are NaN: one sample says it
            values, weights = np.array([NAN]), np.array([1.0])
        else:
            values, inverse = np.unique(values, return_inverse=True)
            weights = np.bincount(inverse, weights=weights, minlength=len(values))
        self.itl_values, self.itl_weights, self._itl_pending = [values], [weights], 0

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.itl_values:
            return np.empty(0), np.empty(0)
        return np.concatenate(self.itl_values), np.concatenate(self.itl_weights)

    @property
    def end_s(self) -> float:
        """The max of ``start_s + duration_s`` (NaN skipped, as pandas does); NaN when there is none."""
        return self.end_max if self.rows and self.has_start and math.isfinite(self.end_max) else NAN

    def stats(self) -> StepStats:
        span = self.end_s - self.start_min if math.isfinite(self.start_min) else NAN
        time = BusyTime() if self.parts is None else BusyTime(*self.parts)
        itl = weighted_percentiles(*self.itl()) if self.rows else (NAN,) * 3
        return StepStats(
            busy_s=self.busy_s,
            busy_fraction=_ratio(self.busy_s, span),
            num_steps=self.num_steps,
            tokens_new=self.tokens_new,
            tokens_recompute=self.tokens_recompute,
            new_token_busy_share=time.new_token_busy_share,
            recompute_busy_share=time.recompute_busy_share,
            new_token_token_share=_ratio(self.tokens_new, self.tokens_all),
            recompute_token_share=_ratio(self.tokens_recompute, self.tokens_all),
            kv_utilization=_ratio(self.kv_weighted, self.busy_s),
            kv_utilization_peak=self.kv_peak if self.kv_peak != -math.inf else NAN,
            swap_out_blocks=self.swap_out_blocks,
            swap_in_blocks=self.swap_in_blocks,
            **dict(zip(("itl_s_p50", "itl_s_p90", "itl_s_p99"), itl)),
            time=time,
        )


#: ITL samples gathered before equal values are merged.
_ITL_COMPACT_AT = 1 << 20


class StepTotals:
    """A run's step metrics accumulated chunk by chunk while the run goes (``add`` each chunk, e.g. as the
    ``step_sink`` of ``sim.runner.Simulation``), keeping no rows: running totals and extremes, and for the ITL
    percentiles each decode step's (time per step, tokens) pair, equal values merged -- exact, the same
    percentiles as the whole table.  ``stats()`` is ``step_stats`` of all the rows (sums equal up to float
    rounding, as they are added per chunk)."""

    def __init__(self) -> None:
        self._partial = _Partial()

    @classmethod
    def of(cls, steps: pd.DataFrame) -> "StepTotals":
        """The totals of a whole step table at once: ``stats()`` is ``step_stats(steps)`` exactly (nothing is added
        per chunk), so a caller can drop the table before the request metrics are computed (``kvtune simulate``)."""
        totals = cls()
        totals._partial = _Partial.of(steps)
        return totals

    def add(self, steps: pd.DataFrame) -> None:
        self._partial.merge(_Partial.of(steps))

    @property
    def rows(self) -> int:
        return self._partial.rows

    @property
    def end_s(self) -> float:
        """When the last step ended (NaN without steps or step starts)."""
        return self._partial.end_s

    def stats(self) -> StepStats:
        return self._partial.stats()


def step_stats(steps: "pd.DataFrame | StepTotals | None") -> StepStats:
    """All step-table metrics; ``None`` (no step table, e.g. some replays) gives all NaN; a :class:`StepTotals`
    stands for the table it collected."""
    if isinstance(steps, StepTotals):
        return steps.stats()
    if steps is None:
        return StepStats()
    return _Partial.of(steps).stats()
