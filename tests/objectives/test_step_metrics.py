"""Step-table metrics: recompute share, busy time on new tokens, KV utilization, swap blocks."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objectives import kv_utilization, new_token_busy_share, recompute_share, step_stats


def test_run_row_counts_its_totals_once(tables):
    s = tables.steps(
        tables.step(duration=0.2, new=400, used=20),
        tables.step(duration=0.5, decode=40, num_steps=5, used=60),  # 5 decode steps of 8 sequences
        tables.step(duration=0.3, recompute=300, used=20),
    )
    stats = step_stats(s)
    assert stats.num_steps == 7 and stats.busy_s == pytest.approx(1.0)
    assert stats.tokens_new == 440 and stats.tokens_recompute == 300
    assert recompute_share(s) == pytest.approx(300 / 740)
    assert new_token_busy_share(s) == pytest.approx(0.7)  # 0.2 + 0.5 of 1.0 s
    assert kv_utilization(s) == pytest.approx((0.2 * 0.2 + 0.5 * 0.6 + 0.3 * 0.2) / 1.0)
    assert stats.kv_utilization_peak == pytest.approx(0.6)


def test_mixed_row_splits_its_duration_by_tokens(tables):
    s = tables.steps(tables.step(duration=1.0, new=100, recompute=300, decode=100))
    assert new_token_busy_share(s) == pytest.approx(0.4)
    assert recompute_share(s) == pytest.approx(0.6)


def test_row_without_tokens_is_busy_time_on_no_new_token(tables):
    s = tables.steps(tables.step(duration=1.0, decode=10), tables.step(duration=1.0, swap_out=8, swap_in=2))
    stats = step_stats(s)
    assert stats.new_token_busy_share == pytest.approx(0.5)
    assert (stats.swap_out_blocks, stats.swap_in_blocks) == (8, 2)


def test_nan_column_gives_nan_metric_not_a_guess(tables):
    s = tables.steps(tables.step(duration=1.0, decode=10), tables.step(duration=1.0, decode=10))
    s.loc[1, "prefill_tokens_recompute"] = math.nan
    s["kv_blocks_used"] = math.nan
    stats = step_stats(s)
    assert math.isnan(stats.recompute_share) and math.isnan(stats.new_token_busy_share)
    assert math.isnan(stats.kv_utilization)
    assert stats.busy_s == 2.0  # columns that are known still count


def test_no_step_table_or_empty_one(tables):
    assert math.isnan(step_stats(None).recompute_share)
    empty = tables.steps(tables.step()).iloc[:0]
    stats = step_stats(empty)
    assert stats.busy_s == 0 and math.isnan(stats.new_token_busy_share)


rows = st.lists(
    st.fixed_dictionaries({
        "duration": st.floats(1e-4, 10), "new": st.integers(0, 5000), "recompute": st.integers(0, 5000),
        "decode": st.integers(0, 512), "num_steps": st.integers(1, 50), "used": st.integers(0, 100),
    }),
    min_size=1, max_size=30,
)


@given(rows)
def test_shares_are_in_unit_interval(tables, drawn):
    stats = step_stats(tables.steps(*(tables.step(**r) for r in drawn)))
    assert 0.0 <= stats.new_token_busy_share <= 1.0 + 1e-12
    assert 0.0 <= stats.kv_utilization <= 1.0 + 1e-12
    if stats.tokens_new + stats.tokens_recompute > 0:
        assert 0.0 <= stats.recompute_share <= 1.0
        assert stats.recompute_share == pytest.approx(
            sum(r["recompute"] for r in drawn) / sum(r["new"] + r["recompute"] + r["decode"] for r in drawn)
        )
    else:
        assert math.isnan(stats.recompute_share)
