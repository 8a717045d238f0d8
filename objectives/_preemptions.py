"""How preemption is spread over requests: a mean hides whether a few requests restart again and again."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._percentile import percentiles
from objectives._tables import values

NAN = float("nan")


@dataclass(frozen=True)
class PreemptionStats:
    """``num_preemptions`` over every request of the table (all statuses); percentiles by the sorted-index
    rule; ``share_ge1``/``share_ge2``: share of requests preempted at least once / twice.  NaN if unknown."""

    total: float = NAN
    mean: float = NAN
    p50: float = NAN
    p90: float = NAN
    p99: float = NAN
    max: float = NAN
    share_ge1: float = NAN
    share_ge2: float = NAN


def preemption_stats(requests: pd.DataFrame) -> PreemptionStats:
    """Distribution of ``num_preemptions`` per request; all NaN when the column holds a NaN or no rows."""
    return preemption_stats_of(values(requests, "num_preemptions"))


def preemption_stats_of(counts: np.ndarray) -> PreemptionStats:
    """:func:`preemption_stats` of the ``num_preemptions`` array."""
    if not counts.size or np.isnan(counts).any():
        return PreemptionStats()
    p50, p90, p99 = percentiles(counts)
    return PreemptionStats(
        total=float(counts.sum()),
        mean=float(counts.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        max=float(counts.max()),
        share_ge1=float((counts >= 1).mean()),
        share_ge2=float((counts >= 2).mean()),
    )
