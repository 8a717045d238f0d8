"""Step-table metrics: of the GPU's busy time and tokens, how much served new tokens.

A step row may stand for a run of ``num_steps`` identical iterations; its ``duration_s`` and token columns
are already totals of the run, so they are summed as they are (never multiplied by ``num_steps``).
A NaN in a column a metric reads makes that metric NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._tables import STEP_COLUMNS, column, require_columns

NAN = float("nan")


@dataclass(frozen=True)
class StepStats:
    """Engine-side totals over the whole run.

    ``recompute_share``: prefill_tokens_recompute / (prefill_tokens_new + prefill_tokens_recompute +
    decode_tokens).  ``new_token_busy_share``: each row's ``duration_s`` is attributed to its tokens in
    proportion, ``duration * (new prefill + decode) / all tokens``; summed and divided by busy time (the sum of
    ``duration_s``; a row with no tokens, e.g. a pure swap step, is busy time spent on no new token).
    ``kv_utilization``: mean of ``kv_blocks_used / kv_blocks_total`` over steps weighted by ``duration_s``.
    """

    busy_s: float = NAN
    num_steps: float = NAN
    tokens_new: float = NAN
    tokens_recompute: float = NAN
    recompute_share: float = NAN
    new_token_busy_share: float = NAN
    kv_utilization: float = NAN
    kv_utilization_peak: float = NAN
    swap_out_blocks: float = NAN
    swap_in_blocks: float = NAN


def _total(values: pd.Series) -> float:
    return float(values.sum(skipna=False))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else NAN  # NaN den compares False: NaN


def recompute_share(steps: pd.DataFrame) -> float:
    """Recomputed prefill tokens over all tokens processed (see ``StepStats``)."""
    return step_stats(steps).recompute_share


def new_token_busy_share(steps: pd.DataFrame) -> float:
    """Share of busy GPU time attributed to new tokens (see ``StepStats``)."""
    return step_stats(steps).new_token_busy_share


def kv_utilization(steps: pd.DataFrame) -> float:
    """Duration-weighted mean KV block utilisation (see ``StepStats``)."""
    return step_stats(steps).kv_utilization


class StepTotals:
    """Step-table metrics accumulated chunk by chunk, so that a run need not keep its step table: ``add`` each
    chunk of rows (a DataFrame with the step-table columns), then ``stats()`` equals ``step_stats`` of all the
    rows together (sums are order-independent up to float rounding).  ``end_s``: the last step end seen."""

    def __init__(self) -> None:
        self.rows = 0
        self.busy_s = 0.0
        self.num_steps = 0.0
        self.tokens_new = 0.0
        self.tokens_recompute = 0.0
        self.new_busy_s = 0.0
        self.kv_busy_s = 0.0
        self.kv_peak = NAN
        self.swap_out_blocks = 0.0
        self.swap_in_blocks = 0.0
        self.end_s = NAN

    def add(self, steps: pd.DataFrame) -> None:
        if not len(steps):
            return
        require_columns(steps, STEP_COLUMNS, "steps")
        duration = column(steps, "duration_s")
        new = column(steps, "prefill_tokens_new") + column(steps, "decode_tokens")
        recompute = column(steps, "prefill_tokens_recompute")
        tokens = new + recompute
        new_share_of_row = (new / tokens).where(tokens > 0, 0.0).mask(tokens.isna(), np.nan)
        kv = column(steps, "kv_blocks_used") / column(steps, "kv_blocks_total").where(lambda t: t > 0)
        self.busy_s += _total(duration)
        self.num_steps += _total(column(steps, "num_steps"))
        self.tokens_new += _total(new)
        self.tokens_recompute += _total(recompute)
        self.new_busy_s += _total(duration * new_share_of_row)
        self.kv_busy_s += _total(duration * kv)
        peak = float(kv.max(skipna=False))
        self.kv_peak = peak if self.rows == 0 or peak != peak else max(self.kv_peak, peak)  # NaN sticks
        self.swap_out_blocks += _total(column(steps, "swap_out_blocks"))
        self.swap_in_blocks += _total(column(steps, "swap_in_blocks"))
        if {"start_s", "duration_s"} <= set(steps.columns):
            end = float((column(steps, "start_s") + duration).max())
            self.end_s = end if self.end_s != self.end_s else max(self.end_s, end)
        self.rows += len(steps)

    def stats(self) -> StepStats:
        tokens = self.tokens_new + self.tokens_recompute
        return StepStats(
            busy_s=self.busy_s,
            num_steps=self.num_steps,
            tokens_new=self.tokens_new,
            tokens_recompute=self.tokens_recompute,
            recompute_share=_ratio(self.tokens_recompute, tokens),
            new_token_busy_share=_ratio(self.new_busy_s, self.busy_s),
            kv_utilization=_ratio(self.kv_busy_s, self.busy_s),
            kv_utilization_peak=self.kv_peak if self.rows else NAN,
            swap_out_blocks=self.swap_out_blocks,
            swap_in_blocks=self.swap_in_blocks,
        )


def step_stats(steps: "pd.DataFrame | StepTotals | None") -> StepStats:
    """All step-table metrics; ``None`` (no step table, e.g. some replays) gives all NaN.  ``steps`` may also be
    a :class:`StepTotals` accumulated while the run went (no step table kept)."""
    if steps is None:
        return StepStats()
    if isinstance(steps, StepTotals):
        return steps.stats()
    totals = StepTotals()
    require_columns(steps, STEP_COLUMNS, "steps")
    totals.add(steps)
    return totals.stats()
