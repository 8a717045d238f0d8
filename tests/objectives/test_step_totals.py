"""``StepTotals`` keeps no step rows, only running totals and the ITL samples (equal values merged), yet its
metrics equal ``step_stats`` of the whole table: sums up to float rounding, extremes and percentiles exactly."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import objectives._steps as steps_module
from objectives import StepTotals, step_stats
from objectives._censor import observation_end
from tests.objectives.conftest import step, steps

_durations = st.sampled_from([0.01, 0.02, 0.025, 0.05, float("nan")])


@st.composite
def _tables(draw):
    n = draw(st.integers(0, 30))
    with_parts = draw(st.booleans())
    rows, start = [], 0.0
    for _ in range(n):
        duration = draw(_durations) if draw(st.integers(0, 9)) == 0 else draw(st.sampled_from([0.01, 0.02, 0.05]))
        parts = {"decode": 0.5 * duration, "overhead": 0.5 * duration} if with_parts else None
        rows.append(step(duration=duration, decode=draw(st.integers(0, 40)), new=draw(st.integers(0, 500)),
                         recompute=draw(st.integers(0, 300)), num_steps=draw(st.integers(0, 4)),
                         used=draw(st.integers(0, 100)), total=draw(st.sampled_from([0, 100, 100, 100])),
                         start=start, swap_out=draw(st.integers(0, 3)), parts=parts))
        start += 0.05
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return (steps(*rows) if rows else steps(step()).iloc[:0]), cuts


def _same(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x):
            _same(x, y)
        elif math.isnan(x):
            assert math.isnan(y), f.name
        elif f.name.startswith(("itl_", "kv_utilization_peak")):
            assert x == y, f.name  # picked or extreme values: exact
        else:
            assert y == pytest.approx(x, rel=1e-12, abs=1e-15), f.name


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table_cuts=_tables(), compact_at=st.sampled_from([1, 3, 1 << 20]))
def test_totals_over_chunks_equal_the_whole_table(table_cuts, compact_at, monkeypatch):
    table, cuts = table_cuts
    monkeypatch.setattr(steps_module, "_ITL_COMPACT_AT", compact_at)  # also merge equal ITL values often
    totals = StepTotals()
    bounds = [0, *cuts, len(table)]
    for lo, hi in zip(bounds, bounds[1:]):
        totals.add(table.iloc[lo:hi])
    assert totals.rows == len(table)
    _same(step_stats(table), totals.stats())
    requests = pd.DataFrame({"end_s": [0.0], "arrival_s": [0.0]})
    whole, streamed = observation_end(requests, table), observation_end(requests, totals)
    assert whole == streamed or (math.isnan(whole) and math.isnan(streamed))


def test_itl_samples_are_merged_not_kept_per_row(monkeypatch):
    """A million decode steps of a few distinct times keep a few samples, with the exact percentiles."""
    monkeypatch.setattr(steps_module, "_ITL_COMPACT_AT", 1000)
    rng = np.random.default_rng(0)
    totals = StepTotals()
    durations = rng.choice([0.010, 0.012, 0.030], size=100_000, p=[0.9, 0.09, 0.01])
    chunk = steps(*(step(duration=d, decode=8) for d in durations[:2000]))
    for _ in range(50):
        totals.add(chunk)
    partial = totals._partial  # noqa: SLF001
    assert sum(len(v) for v in partial.itl_values) <= 1000 + 2000
    values = np.tile(chunk["duration_s"].to_numpy(), 50)
    assert totals.stats().itl_s_p99 == float(np.percentile(values, 99, method="higher"))
    assert totals.stats().itl_s_p50 == float(np.percentile(values, 50, method="higher"))
