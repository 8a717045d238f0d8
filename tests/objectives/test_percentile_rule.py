"""The single percentile rule: sorted index ceil(q/100 * (n-1)), inf-safe, NaN if anything is unknown."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from objectives import percentile, percentiles

finite_or_inf = st.one_of(st.floats(0, 1e6, allow_nan=False), st.just(math.inf))


def test_sorted_index_rule_on_hand_values():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]  # sorted 1..5, n-1 = 4
    assert percentile(values, 50) == 3.0  # index ceil(2.0) = 2
    assert percentile(values, 60) == 4.0  # index ceil(2.4) = 3: never interpolates
    assert percentile(values, 99) == 5.0


def test_p99_of_100_values_is_the_largest():
    assert percentiles(range(1, 101)) == (51.0, 91.0, 100.0)


def test_inf_values_do_not_make_nan():
    assert percentiles([1.0, 2.0, math.inf]) == (2.0, math.inf, math.inf)
    assert percentile([math.inf] * 4, 50) == math.inf


def test_unknown_or_empty_gives_nan():
    assert math.isnan(percentile([1.0, float("nan"), 3.0], 50))
    assert all(math.isnan(v) for v in percentiles([]))


@given(st.lists(finite_or_inf, min_size=1, max_size=60))
def test_percentiles_are_monotone_and_observed(values):
    p50, p90, p99 = percentiles(values)
    assert p50 <= p90 <= p99 <= max(values)
    assert {p50, p90, p99} <= set(values)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(0, 100))
def test_matches_numpy_higher(values, q):
    assert percentile(values, q) == float(np.percentile(values, q, method="higher"))


@given(st.lists(finite_or_inf, min_size=1, max_size=60), finite_or_inf)
def test_adding_a_value_at_least_the_max_never_lowers_a_percentile(values, extra):
    extra = max(extra, max(values))
    before, after = percentiles(values), percentiles(values + [extra])
    assert all(b <= a for b, a in zip(before, after))
