"""The compiled decode-column kernels (sim/engine/_column_kernels.py) against plain numpy statements of what each
computes, on random segments: block boundaries, budgets, finished requests, NaN longest gaps (a request with one
token so far) and runs of several steps.  The end-to-end property (tables identical to the Request-object path)
is tests/sim/engine/test_decode_columns.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine import _column_kernels as kernels
from sim.engine.scheduler_base import block_limit


@st.composite
def segments(draw):
    n = draw(st.integers(0, 40))
    block_size = draw(st.sampled_from([1, 4, 16]))
    computed = np.array(draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), dtype=np.int64)
    final = computed + np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.int64)
    spare = draw(st.integers(0, 3))  # unused columns after the segment must stay untouched
    ints = np.zeros((5, n + spare), dtype=np.int64)
    ints[0, :n], ints[1, :n] = computed, final
    ints[2:, :] = draw(st.integers(0, 9))
    last = np.array(draw(st.lists(st.floats(0, 10), min_size=n, max_size=n)))
    itl = np.array(draw(st.lists(st.one_of(st.just(np.nan), st.floats(0, 5)), min_size=n, max_size=n)))
    floats = np.full((4, n + spare), 7.0)
    floats[0, :n], floats[1, :n] = last, itl
    return ints, floats, n, block_size


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seg=segments(), free=st.integers(0, 50), limit=st.integers(0, 60), touch_one=st.booleans())
def test_scan_is_the_longest_fitting_prefix(seg, free, limit, touch_one):
    ints, _, n, block_size = seg
    computed, final = ints[0, :n], ints[1, :n]
    crossing = computed % block_size == 0
    if touch_one:  # V0: a free block must be left after the blocks of the requests before
        fits = int(np.searchsorted(np.cumsum(crossing) - crossing, free, side="left"))
    else:  # V1: the blocks up to and including the request's own must fit
        fits = int(np.searchsorted(np.cumsum(crossing), free, side="right"))
    fit = min(n, limit, fits)
    expected = (fit, int(crossing[:fit].sum()), int((computed[:fit] + 1).sum()),
                int((final[:fit] - computed[:fit]).min()) if fit else 1 << 62)
    assert kernels.scan(ints, n, block_size, free, limit, touch_one) == expected


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seg=segments(), rest=st.lists(st.integers(1, 300), max_size=12), free=st.integers(0, 120),
       limit=st.integers(1, 200))
def test_run_block_limit_is_the_numpy_block_bound(seg, rest, free, limit):
    """A decode run's block bound over the segment (tokens ``c + 1``) and the requests after it, against the
    engine's closed form (``block_limit``, used when no columns are live)."""
    ints, _, n, block_size = seg
    rest = np.array(rest, dtype=np.int64)
    tokens = np.concatenate((ints[0, :n] + 1, rest))
    assert kernels.run_block_limit(ints, n, rest, block_size, free, limit) == block_limit(tokens.tolist(), block_size,
                                                                                           free, limit)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seg=segments(), steps=st.integers(1, 40), end=st.floats(10, 20), first=st.floats(10, 20),
       last_gap=st.one_of(st.just(np.nan), st.floats(0, 3)), shares=st.booleans())
def test_advance_matches_numpy(seg, steps, end, first, last_gap, shares):
    ints, floats, n, block_size = seg
    want_i, want_f = ints.copy(), floats.copy()
    computed = want_i[0, :n]
    if steps == 1:
        gap = end - want_f[0, :n]
        grown, crossed = 0, None
    else:
        gap = np.maximum(first - want_f[0, :n], last_gap)
        after = computed + steps
        grown = int((-(-after // block_size) - -(-(computed + 1) // block_size)).sum())
        crossed = np.flatnonzero(after // block_size > computed // block_size)
    want_f[1, :n] = np.fmax(want_f[1, :n], gap)
    want_f[0, :n] = end
    if shares:
        want_f[2, :n] += 0.25
        want_f[3, :n] += 0.125
    computed += steps
    positions = np.zeros(max(n, 1), dtype=np.int64)
    got_grown, k = kernels.advance(ints, floats, n, block_size, end, steps, first, last_gap, shares,
                                   0.25 if shares else 0.0, 0.125 if shares else 0.0, positions)
    np.testing.assert_array_equal(ints, want_i)
    np.testing.assert_array_equal(floats, want_f)  # NaN equal to NaN, exact otherwise
    assert got_grown == grown
    if crossed is not None:
        np.testing.assert_array_equal(positions[:k], crossed)
    got = positions[:kernels.finished(ints, n, positions)]
    np.testing.assert_array_equal(got, np.flatnonzero(want_i[0, :n] >= want_i[1, :n]))
    got = positions[:kernels.filling(ints, n, block_size, positions)]
    np.testing.assert_array_equal(got, np.flatnonzero((want_i[0, :n] + 1) % block_size == 0))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(seg=segments(), data=st.data())
def test_compact_keeps_the_others_in_order(seg, data):
    ints, floats, n, _ = seg
    drop = sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n)) if n else [])
    keep = np.setdiff1d(np.arange(n), drop)
    want_i, want_f = ints[:, keep].copy(), floats[:, keep].copy()
    positions = np.array(drop + [0], dtype=np.int64)
    assert kernels.compact(ints, floats, n, positions, len(drop)) == len(keep)
    np.testing.assert_array_equal(ints[:, :len(keep)], want_i)
    np.testing.assert_array_equal(floats[:, :len(keep)], want_f)


def test_kernels_compile_where_numba_cannot_cache(monkeypatch):
    # A read-only install with no writable home: numba's njit(cache=True) raises "no locator available"; the
    # kernels are then compiled without the on-disk cache and give the same answers.
    import importlib

    import numba

    real = numba.njit

    def njit(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'scan': no locator available for file '...'")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", njit)
    fresh = importlib.reload(kernels)
    try:
        ints = np.array([[16, 17, 32], [20, 40, 33], [0, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=np.int64)
        assert fresh.scan(ints, 3, 16, 1, 3, False) == (2, 1, 35, 4)
        assert type(fresh.scan._cache).__name__ == "NullCache"  # compiled in this process, not cached
    finally:
        monkeypatch.undo()
        importlib.reload(kernels)
