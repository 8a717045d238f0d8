"""What the busy GPU time served: each step's duration split by marginal cost (``sim.latency.StepParts``).

Parts: ``prefill_new`` (prompt tokens computed for the first time), ``recompute`` (tokens re-prefilled after a
preemption), ``decode``, ``transfer`` (host-link swap and offload traffic), ``overhead`` (the batch-independent
time of every step, less what async scheduling hides).  A step's parts sum to its duration, so the run's parts
sum to its busy time.  ``new_token_busy_share`` = (prefill_new + decode) / busy time: the share of busy time that
produced tokens a user had not been served yet.  Token counts weigh a prefill token like a decode token although
one costs 10-100x less time; the token shares are reported beside, named ``*_token_share``.

Per cohort, the same parts come from the request table (``time_*_s``: each request's share of the steps it was in,
split by its tokens of each kind; the overhead equally over the step's requests), plus transfer apportioned by
the blocks each request moved.  Steps that served no request (a step that only swapped) are in the run's parts
but in no cohort's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._tables import column
from sim.latency import PART_NAMES

NAN = float("nan")
#: Step-table columns holding the parts.
STEP_TIME_COLUMNS: tuple[str, ...] = tuple(f"time_{p}_s" for p in PART_NAMES)


@dataclass(frozen=True)
class BusyTime:
    """Seconds of busy time by part and the time shares (NaN when the table has no parts or no busy time)."""

    prefill_new_s: float = NAN
    recompute_s: float = NAN
    decode_s: float = NAN
    transfer_s: float = NAN
    overhead_s: float = NAN

    @property
    def busy_s(self) -> float:
        return self.prefill_new_s + self.recompute_s + self.decode_s + self.transfer_s + self.overhead_s

    def share(self, *parts: str) -> float:
        busy = self.busy_s
        return sum(getattr(self, f"{p}_s") for p in parts) / busy if busy > 0 else NAN

    @property
    def new_token_busy_share(self) -> float:
        return self.share("prefill_new", "decode")

    @property
    def recompute_busy_share(self) -> float:
        return self.share("recompute")

    def to_dict(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}{p}_s": getattr(self, f"{p}_s") for p in PART_NAMES}
        out[f"{prefix}busy_s"] = self.busy_s
        return out


def _sum(values: pd.Series) -> float:
    return float(values.sum(skipna=False))


def busy_from_steps(steps: pd.DataFrame | None) -> BusyTime:
    """The run's busy time by part, from the step table's ``time_*_s`` columns (NaN if it has none)."""
    if steps is None or not set(STEP_TIME_COLUMNS) <= set(steps.columns):
        return BusyTime()
    return BusyTime(*(_sum(column(steps, c)) for c in STEP_TIME_COLUMNS))


def transfer_per_block(moved: np.ndarray, run: BusyTime) -> float:
    """The run's host-link seconds per block moved, from the blocks each request moved (swapped or offloaded out,
    and back in: ``RequestArrays.moved``); 0 when none moved, NaN when unknown."""
    total = float(moved.sum())  # NaN propagates
    if total == 0:
        return 0.0
    return run.transfer_s / total
