"""Compiled loops over the decode columns (numba, ``cache=True``: compiled once per machine, then loaded).

Each is one pass over the segment's columns in the layout of :class:`sim.engine.decode_columns.DecodeColumns`
(rows of ``ints``: computed, final, prompt, proc_off, kv_join, index; rows of ``floats``: last_token, max_itl,
time_decode, time_overhead; one column per segment request, the first ``n`` in use).  A numpy version needs
about fifteen array calls a step, ~1 us each whatever the batch, so the columns paid only from ~192 requests;
one compiled call costs well under a microsecond, so they pay from a few dozen.  The arithmetic is the object
path's (``BaseScheduler.update_from_output``), in the same IEEE doubles, so the tables stay bit-identical
(tests/sim/engine/test_decode_columns.py, benchmarks/tools/compare_tables.py).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

_C, _FINAL = 0, 1
_LT, _ITL, _TD, _TO = 0, 1, 2, 3


def _compiled(fn):
    """``numba.njit`` with the on-disk cache (next to this file, else numba's user-wide cache directory); where
    neither is writable numba refuses to cache, and the kernel is compiled in each process instead (a few
    seconds at the first call; same results).

    With ``NUMBA_DISABLE_JIT=1`` the kernel runs as Python, where an element of an array is a numpy scalar
    (``numpy.int64``), not the ``int`` a compiled kernel returns; the mypyc-compiled callers (sim/_compiled.py)
    type their locals and would refuse it.  So the Python kernel's results are made plain ``int`` / ``float``
    (:func:`_plain`): numba off alone runs on the compiled engine (tests/sim/engine/test_compiled_engine.py)."""
    if numba.config.DISABLE_JIT:
        return _plain(fn)
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(fn)


def _scalar(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _plain(fn):
    """``fn`` (a kernel run as Python) with its numpy scalar results made Python ones, a tuple's items too."""

    @functools.wraps(fn)
    def kernel(*args):
        result = fn(*args)
        if type(result) is tuple:
            return tuple(_scalar(item) for item in result)
        return _scalar(result)

    return kernel


@_compiled
def scan(ints, n, block_size, free, limit, touch_one):
    """``(fit, need, context, min_remaining)``: the longest leading run, at most ``limit`` long, whose new blocks
    (one for a request at a block boundary, ``c % B == 0``) fit ``free``, as the general loop takes them in
    order; the blocks it needs, its decode context (sum of ``c + 1``) and its fewest remaining outputs.
    ``touch_one`` (V0's can_append_slots): a request fits while a free block is left after the ones before it,
    whether or not it needs one."""
    need = 0
    context = 0
    min_remaining = 1 << 62
    fit = 0
    stop = n if n < limit else limit
    for i in range(stop):
        c = ints[_C, i]
        grow = 1 if c % block_size == 0 else 0
        if touch_one:
            if need >= free:
                break
        elif need + grow > free:
            break
        need += grow
        context += c + 1
        remaining = ints[_FINAL, i] - c
        if remaining < min_remaining:
            min_remaining = remaining
        fit += 1
    return fit, need, context, min_remaining


@_compiled
def advance(ints, floats, n, block_size, end_s, num_steps, first_end_s, last_gap_s, shares, decode_share,
            overhead_share, crossed):
    """Apply ``num_steps`` decode steps ending at ``end_s`` to the first ``n`` columns.  A single step's gap is
    ``end_s - last token``; a run's is ``max(first_end_s - last token, last_gap_s)`` (NaN if either is, as
    ``np.maximum``), and the longest gap keeps the non-NaN one of the two (``np.fmax``).  Returns the blocks a
    run grew by after its first step (``schedule()`` allocated the first's) and writes into ``crossed`` the
    positions whose run filled a new block (for hashing); returns their count too."""
    grown = 0
    ncrossed = 0
    for i in range(n):
        c = ints[_C, i]
        last = floats[_LT, i]
        if num_steps == 1:
            gap = end_s - last
        else:
            gap = first_end_s - last
            if gap != gap or last_gap_s != last_gap_s:
                gap = np.nan
            elif last_gap_s > gap:
                gap = last_gap_s
            after = c + num_steps
            grown += -(-after // block_size) - -(-(c + 1) // block_size)
            if after // block_size > c // block_size:
                crossed[ncrossed] = i
                ncrossed += 1
        itl = floats[_ITL, i]
        if itl != itl or (gap == gap and gap > itl):
            floats[_ITL, i] = gap
        floats[_LT, i] = end_s
        if shares:
            floats[_TD, i] += decode_share
            floats[_TO, i] += overhead_share
        ints[_C, i] = c + num_steps
    return grown, ncrossed


@_compiled
def finished(ints, n, out):
    """Positions (into ``out``, ascending) whose last output token came out: computed >= final; their count."""
    k = 0
    for i in range(n):
        if ints[_C, i] >= ints[_FINAL, i]:
            out[k] = i
            k += 1
    return k


@_compiled
def filling(ints, n, block_size, out):
    """Positions (into ``out``) whose next token fills a block (``(c + 1) % B == 0``); their count."""
    k = 0
    for i in range(n):
        if (ints[_C, i] + 1) % block_size == 0:
            out[k] = i
            k += 1
    return k


@_compiled
def compact(ints, floats, n, positions, k):
    """Take the columns at ``positions[:k]`` (ascending) out, shifting the others left in order."""
    write = 0
    drop = 0
    for i in range(n):
        if drop < k and positions[drop] == i:
            drop += 1
            continue
        if write != i:
            for row in range(ints.shape[0]):
                ints[row, write] = ints[row, i]
            for row in range(floats.shape[0]):
                floats[row, write] = floats[row, i]
        write += 1
    return write


@_compiled
def run_block_limit(ints, n, rest, block_size, free, limit):
    """Steps of a decode run (at most ``limit``) before its block demand exceeds ``free``: the running requests
    are the segment's ``n`` (tokens ``c + 1``) and then those of ``rest`` (their token counts).  Step ``j >= 1``
    needs a new block for a request of ``t`` tokens where ``(t + j - 1) % B == 0``; the run stops before the
    first step whose demand, summed from step 1, exceeds ``free``.  The same count as the closed form
    ``sim.engine.scheduler_base.block_limit`` (the crossings by residue, summed in whole periods)."""
    per_residue = np.zeros(block_size, dtype=np.int64)
    for i in range(n):
        per_residue[((-(ints[_C, i] + 1)) % block_size + 1) % block_size] += 1
    for i in range(rest.shape[0]):
        per_residue[((-rest[i]) % block_size + 1) % block_size] += 1
    demand = 0
    for j in range(1, limit):
        demand += per_residue[j % block_size]
        if demand > free:
            return j
    return limit


def warm_up() -> None:
    """Call every kernel once on a small segment (loads them from numba's cache, or compiles them)."""
    ints = np.zeros((6, 4), dtype=np.int64)
    floats = np.zeros((4, 4), dtype=np.float64)
    positions = np.zeros(4, dtype=np.int64)
    scan(ints, 2, 16, 4, 4, False)
    scan(ints, 2, 16, 4, 4, True)
    advance(ints, floats, 2, 16, 1.0, 1, 0.0, 0.0, True, 0.0, 0.0, positions)
    advance(ints, floats, 2, 16, 1.0, 2, 0.5, 0.5, False, 0.0, 0.0, positions)
    finished(ints, 2, positions)
    filling(ints, 2, 16, positions)
    compact(ints, floats, 2, positions, 0)
    run_block_limit(ints, 2, positions, 16, 4, 8)
