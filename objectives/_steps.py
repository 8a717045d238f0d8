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


def step_stats(steps: pd.DataFrame | None) -> StepStats:
    """All step-table metrics; ``None`` (no step table, e.g. some replays) gives all NaN."""
    if steps is None:
        return StepStats()
    require_columns(steps, STEP_COLUMNS, "steps")
    duration = column(steps, "duration_s")
    new = column(steps, "prefill_tokens_new") + column(steps, "decode_tokens")
    recompute = column(steps, "prefill_tokens_recompute")
    tokens = new + recompute
    busy = _total(duration)
    new_share_of_row = (new / tokens).where(tokens > 0, 0.0).mask(tokens.isna(), np.nan)
    kv = column(steps, "kv_blocks_used") / column(steps, "kv_blocks_total").where(lambda t: t > 0)
    return StepStats(
        busy_s=busy,
        num_steps=_total(column(steps, "num_steps")),
        tokens_new=_total(new),
        tokens_recompute=_total(recompute),
        recompute_share=_ratio(_total(recompute), _total(tokens)),
        new_token_busy_share=_ratio(_total(duration * new_share_of_row), busy),
        kv_utilization=_ratio(_total(duration * kv), busy),
        kv_utilization_peak=float(kv.max(skipna=False)) if len(kv) else NAN,
        swap_out_blocks=_total(column(steps, "swap_out_blocks")),
        swap_in_blocks=_total(column(steps, "swap_in_blocks")),
    )
