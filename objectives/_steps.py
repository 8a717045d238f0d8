"""Step-table metrics: how busy the GPU was, what its busy time served, KV use and inter-token latency.

A step row may stand for a run of ``num_steps`` identical iterations; its ``duration_s`` and token columns
are already totals of the run, so they are summed as they are (never multiplied by ``num_steps``).
A NaN in a column a metric reads makes that metric NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._busy import BusyTime, busy_from_steps
from objectives._percentile import weighted_percentiles
from objectives._tables import STEP_COLUMNS, column, require_columns

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


def step_itl(steps: pd.DataFrame) -> tuple[float, ...]:
    """p50/p90/p99 inter-token latency of running decodes (see ``StepStats``)."""
    decode = column(steps, "decode_tokens")
    per_step = column(steps, "duration_s") / column(steps, "num_steps").where(lambda n: n > 0)
    rows = decode > 0
    return weighted_percentiles(per_step[rows].to_numpy(), decode[rows].to_numpy())


class StepTotals:
    """A run's step table collected chunk by chunk while the run goes (``add`` each chunk, e.g. as the
    ``step_sink`` of ``sim.runner.Simulation``), so that the run keeps no row tuples: the chunks are numeric
    columns (about a third of the memory).  ``stats()`` is ``step_stats`` of all the rows; the step metrics
    include percentiles (inter-token latency), so the chunks are kept rather than summed."""

    def __init__(self) -> None:
        self._chunks: list[pd.DataFrame] = []
        self.rows = 0

    def add(self, steps: pd.DataFrame) -> None:
        if len(steps):
            # Only what the step metrics read: the required columns, step starts and the time breakdown.
            keep = [c for c in steps.columns if c in STEP_COLUMNS or c == "start_s" or c.startswith("time_")]
            self._chunks.append(steps[keep] if len(keep) < len(steps.columns) else steps)
            self.rows += len(steps)

    def table(self) -> pd.DataFrame:
        """All rows collected (an empty table with the step columns when there were none)."""
        if not self._chunks:
            return pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS})
        if len(self._chunks) > 1:
            self._chunks = [pd.concat(self._chunks, ignore_index=True)]
        return self._chunks[0]

    @property
    def end_s(self) -> float:
        table = self.table()
        return float((column(table, "start_s") + column(table, "duration_s")).max()) if len(table) else NAN

    def stats(self) -> StepStats:
        return step_stats(self.table())


def step_stats(steps: "pd.DataFrame | StepTotals | None") -> StepStats:
    """All step-table metrics; ``None`` (no step table, e.g. some replays) gives all NaN; a :class:`StepTotals`
    stands for the table it collected."""
    if isinstance(steps, StepTotals):
        steps = steps.table()
    if steps is None:
        return StepStats()
    require_columns(steps, STEP_COLUMNS, "steps")
    duration = column(steps, "duration_s")
    new = column(steps, "prefill_tokens_new") + column(steps, "decode_tokens")
    recompute = column(steps, "prefill_tokens_recompute")
    tokens = new + recompute
    busy = _total(duration)
    span = NAN
    if "start_s" in steps.columns and len(steps):
        start = column(steps, "start_s")
        span = float((start + duration).max() - start.min())
    kv = column(steps, "kv_blocks_used") / column(steps, "kv_blocks_total").where(lambda t: t > 0)
    time = busy_from_steps(steps)
    return StepStats(
        busy_s=busy,
        busy_fraction=_ratio(busy, span),
        num_steps=_total(column(steps, "num_steps")),
        tokens_new=_total(new),
        tokens_recompute=_total(recompute),
        new_token_busy_share=time.new_token_busy_share,
        recompute_busy_share=time.recompute_busy_share,
        new_token_token_share=_ratio(_total(new), _total(tokens)),
        recompute_token_share=_ratio(_total(recompute), _total(tokens)),
        kv_utilization=_ratio(_total(duration * kv), busy),
        kv_utilization_peak=float(kv.max(skipna=False)) if len(kv) else NAN,
        swap_out_blocks=_total(column(steps, "swap_out_blocks")),
        swap_in_blocks=_total(column(steps, "swap_in_blocks")),
        **dict(zip(("itl_s_p50", "itl_s_p90", "itl_s_p99"), step_itl(steps) if len(steps) else (NAN,) * 3)),
        time=time,
    )
