"""Step-table metrics: busy time by what it served (time parts), token shares, KV utilization, ITL, swaps."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from objectives import kv_utilization, new_token_busy_share, percentiles, recompute_token_share, step_stats
from objectives._percentile import weighted_percentiles


def test_run_row_counts_its_totals_once(tables):
    s = tables.steps(
        tables.step(duration=0.2, new=400, used=20, parts={"prefill_new": 0.18, "overhead": 0.02}),
        tables.step(duration=0.5, decode=40, num_steps=5, used=60, parts={"decode": 0.4, "overhead": 0.1}),
        tables.step(duration=0.3, recompute=300, used=20, parts={"recompute": 0.28, "overhead": 0.02}),
    )
    stats = step_stats(s)
    assert stats.num_steps == 7 and stats.busy_s == pytest.approx(1.0)
    assert stats.tokens_new == 440 and stats.tokens_recompute == 300
    assert recompute_token_share(s) == pytest.approx(300 / 740)
    assert new_token_busy_share(s) == pytest.approx(0.58)  # 0.18 + 0.4 of 1.0 s
    assert stats.recompute_busy_share == pytest.approx(0.28)
    assert stats.time.overhead_s == pytest.approx(0.14) and stats.time.busy_s == pytest.approx(stats.busy_s)
    assert kv_utilization(s) == pytest.approx((0.2 * 0.2 + 0.5 * 0.6 + 0.3 * 0.2) / 1.0)
    assert stats.kv_utilization_peak == pytest.approx(0.6)


def test_mixed_step_is_split_by_time_not_by_tokens(tables):
    """The issue's L40S step: 1,500 recompute tokens with 60 decodes, 133 ms of which the decodes alone take
    61 ms.  By time the recompute is 0.54 of the step; by tokens it was charged 0.96."""
    s = tables.steps(tables.step(duration=0.133, recompute=1500, decode=60,
                                 parts={"recompute": 0.072, "decode": 0.055, "overhead": 0.006}))
    stats = step_stats(s)
    assert stats.recompute_busy_share == pytest.approx(0.072 / 0.133)
    assert stats.recompute_token_share == pytest.approx(1500 / 1560)
    assert stats.new_token_busy_share == pytest.approx(0.055 / 0.133)
    assert stats.new_token_token_share == pytest.approx(60 / 1560)


def test_busy_fraction_is_stepping_time_over_the_span(tables):
    s = tables.steps(tables.step(start=0.0, duration=1.0, decode=1), tables.step(start=3.0, duration=1.0, decode=1))
    assert step_stats(s).busy_fraction == pytest.approx(0.5)


def test_transfer_and_overhead_are_not_new_token_time(tables):
    s = tables.steps(tables.step(duration=1.0, decode=10, parts={"decode": 1.0}),
                     tables.step(duration=1.0, swap_out=8, swap_in=2, parts={"transfer": 1.0}))
    stats = step_stats(s)
    assert stats.new_token_busy_share == pytest.approx(0.5)
    assert (stats.swap_out_blocks, stats.swap_in_blocks) == (8, 2)


def test_nan_column_gives_nan_metric_not_a_guess(tables):
    s = tables.steps(tables.step(duration=1.0, decode=10), tables.step(duration=1.0, decode=10))
    s.loc[1, "prefill_tokens_recompute"] = math.nan
    s["kv_blocks_used"] = math.nan
    stats = step_stats(s)
    assert math.isnan(stats.recompute_token_share) and math.isnan(stats.new_token_token_share)
    assert math.isnan(stats.new_token_busy_share)  # no time parts in the table (a replay's timeline)
    assert math.isnan(stats.kv_utilization)
    assert stats.busy_s == 2.0  # columns that are known still count


def test_no_step_table_or_empty_one(tables):
    assert math.isnan(step_stats(None).recompute_token_share)
    empty = tables.steps(tables.step(parts={})).iloc[:0]
    stats = step_stats(empty)
    assert stats.busy_s == 0 and math.isnan(stats.new_token_busy_share)


def test_itl_weights_each_decode_token_with_its_step_time(tables):
    s = tables.steps(tables.step(duration=0.5, decode=50, num_steps=10),  # 10 steps of 0.05 s, 5 decodes each
                     tables.step(duration=0.2, decode=1, new=100))  # one slow mixed step, one decode
    stats = step_stats(s)
    assert stats.itl_s_p50 == pytest.approx(0.05) and stats.itl_s_p99 == pytest.approx(0.2)


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), min_size=1, max_size=12))
def test_weighted_percentiles_equal_expanded_ones(pairs):
    values = np.array([v for v, _ in pairs], dtype=float)
    weights = np.array([w for _, w in pairs])
    qs = (0, 50, 90, 99, 100)
    if weights.sum() == 0:
        assert all(math.isnan(v) for v in weighted_percentiles(values, weights, qs))
    else:
        assert weighted_percentiles(values, weights, qs) == percentiles(np.repeat(values, weights), qs)


rows = st.lists(
    st.fixed_dictionaries({
        "duration": st.floats(1e-4, 10), "new": st.integers(0, 5000), "recompute": st.integers(0, 5000),
        "decode": st.integers(0, 512), "num_steps": st.integers(1, 50), "used": st.integers(0, 100),
        "split": st.lists(st.floats(0, 1), min_size=5, max_size=5),
    }),
    min_size=1, max_size=30,
)


@given(rows)
def test_shares_are_in_unit_interval(tables, drawn):
    built = []
    for r in drawn:
        split, duration = r.pop("split"), r["duration"]
        weights = np.array(split) + 1e-9
        parts = dict(zip(("prefill_new", "recompute", "decode", "transfer", "overhead"), duration * weights / weights.sum()))
        built.append(tables.step(parts=parts, **r))
    stats = step_stats(tables.steps(*built))
    assert stats.time.busy_s == pytest.approx(stats.busy_s)
    for share in (stats.new_token_busy_share, stats.recompute_busy_share, stats.kv_utilization):
        assert 0.0 <= share <= 1.0 + 1e-12
    if stats.tokens_new + stats.tokens_recompute > 0:
        assert 0.0 <= stats.recompute_token_share <= 1.0
        assert stats.recompute_token_share == pytest.approx(
            sum(r["recompute"] for r in drawn) / sum(r["new"] + r["recompute"] + r["decode"] for r in drawn)
        )
    else:
        assert math.isnan(stats.recompute_token_share)
