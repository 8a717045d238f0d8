"""The one percentile rule every kvtune metric uses.

Rule: the sorted-index ("higher") rule, numpy's ``method="higher"``: the p-th percentile of n values is the
value at 0-based index ``ceil(p/100 * (n - 1))`` of the sorted values.  It always returns an observed value
(no interpolation), so columns holding ``+inf`` (censored requests) work, and it never reports a tail below
the linear estimate.  Any NaN (an unknown value) makes the result NaN; no values give NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

#: The percentiles reported for every latency metric.
QUANTILES: tuple[int, ...] = (50, 90, 99)


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by the sorted-index rule above."""
    return percentiles(values, (q,))[0]


def percentiles(values: Iterable[float], qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
    """Several percentiles of the same values, in the order of ``qs``."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype="float64")
    if arr.size == 0 or np.isnan(arr).any():
        return tuple(float("nan") for _ in qs)
    return tuple(float(v) for v in np.percentile(arr, list(qs), method="higher"))


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
    """:func:`percentiles` of ``values`` each repeated ``weights`` times (non-negative integers), without
    expanding them: the value whose cumulative weight first exceeds the 0-based index ``ceil(q/100 * (N - 1))``."""
    values = np.asarray(values, dtype="float64")
    weights = np.asarray(weights, dtype="float64")
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = weights.sum()
    if total <= 0 or np.isnan(values).any() or np.isnan(total):
        return tuple(float("nan") for _ in qs)
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    out = []
    for q in qs:
        index = np.ceil(q / 100.0 * (total - 1))
        out.append(float(values[int(np.searchsorted(cumulative, index, side="right"))]))
    return tuple(out)
