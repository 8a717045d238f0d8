"""The one percentile rule every kvtune metric uses.

Rule: the sorted-index ("higher") rule, numpy's ``method="higher"``: the p-th percentile of n values is the
value at 0-based index ``ceil(p/100 * (n - 1))`` of the sorted values.  It always returns an observed value
(no interpolation), so columns holding ``+inf`` (censored requests) work, and it never reports a tail below
the linear estimate.  Any NaN (an unknown value) makes the result NaN; no values give NaN.

``SortedColumn`` and ``sorted_percentiles`` give the same values for many subsets of one column (the cohorts of a
summary): the column is sorted once, a subset's values come out of it already sorted, and the rule's index is
computed as numpy computes it, so no subset is sorted again.
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


def _fractions(qs: Sequence[float]) -> np.ndarray:
    """``qs`` as fractions, the way ``np.percentile`` divides them."""
    return np.true_divide(list(qs), 100)


_DEFAULT_FRACTIONS = _fractions(QUANTILES)


def sorted_percentiles(ascending: np.ndarray, qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
    """:func:`percentiles` of values already sorted ascending with any NaN last (``np.sort`` order): the same
    result, without sorting.  The index is numpy's for ``method="higher"``: ``ceil((n - 1) * (q / 100))``."""
    n = ascending.size
    if n == 0 or np.isnan(ascending[-1]):
        return tuple(float("nan") for _ in qs)
    fractions = _DEFAULT_FRACTIONS if tuple(qs) == QUANTILES else _fractions(qs)
    index = np.ceil((n - 1) * fractions).astype(np.intp)
    return tuple(float(v) for v in ascending[index])


class SortedColumn:
    """One column sorted once (stable, NaN last): :meth:`of` gives the values of any subset of its rows in
    ascending order, for :func:`sorted_percentiles`, without sorting the subset."""

    __slots__ = ("_order", "_ascending")

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype="float64")
        self._order = np.argsort(values, kind="stable")
        self._ascending = values[self._order]

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The values of the rows selected by the boolean mask ``rows``, ascending, NaN last."""
        return self._ascending[rows[self._order]]
