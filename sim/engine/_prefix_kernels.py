"""The shared-prefix block pool's block-by-block loops, compiled (numba, ``cache=True``, as
``sim/engine/_column_kernels.py``), over the pool's state as arrays (``sim/engine/prefix_pool.py``).

A hashed block is a *slot* ``s`` in ``[0, num_blocks)`` (hashed blocks, used or cached, never outnumber the pool's
blocks).  ``blk`` rows, one column per slot:

- ``KEY``: its hash; ``REF``: its reference count (0: in the free queue; -1: the slot carries no block);
  ``SERIAL``: when it was hashed (the pool's running count of hashed blocks; orders copies, names blocks in tests);
- ``QPREV`` / ``QNEXT``: the free queue of cached blocks, a doubly linked list (-1: none), front = next evicted;
- ``CNEXT``: the next younger copy of the same hash (-1: none);
- ``STACK``: (by position, not slot) the slots carrying no block; ``state[TOP]`` of them, the last one popped first.

``tab`` is an open-addressing hash map (linear probing, a power-of-two size at least twice ``num_blocks``, so at
most half full) from a hash to its copies: rows ``TKEY``, ``THEAD`` (oldest copy; -1: the row is empty) and
``TTAIL`` (youngest copy).  A row is deleted by shifting the rows after it back (no tombstones).  ``state``:
``QHEAD``, ``QTAIL`` (the free queue's ends), ``TOP``, ``SHIFT`` (64 - log2 of the map's size).

A request's own block hashed before its first free is in none of these (the pool names it ``~serial`` in the
request's ``block_ids``; see ``PrefixBlockPool.cache_blocks``) until :func:`free` maps it.

Every kernel returns a negative value where it found the state broken (never, while the invariants hold); the pool
raises then.  tests/sim/engine/test_prefix_pool.py checks the pool against a dict-based one, call by call.
"""

from __future__ import annotations

import numpy as np

from sim.engine._column_kernels import _compiled

KEY, REF, SERIAL, QPREV, QNEXT, CNEXT, STACK = 0, 1, 2, 3, 4, 5, 6
BLK_ROWS = 7
TKEY, THEAD, TTAIL = 0, 1, 2
QHEAD, QTAIL, TOP, SHIFT = 0, 1, 2, 3
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the product's top bits pick the row


@_compiled
def _home(key, shift):
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(shift))


@_compiled
def _find(tab, key, shift):
    """The row holding ``key``, else ``~row`` of the empty row where it would go."""
    mask = tab.shape[1] - 1
    i = _home(key, shift)
    while tab[THEAD, i] != -1:
        if tab[TKEY, i] == key:
            return i
        i = (i + 1) & mask
    return ~i


@_compiled
def _delete_row(tab, i, shift):
    """Empty row ``i``, shifting back the rows of its probe run that may move (backward-shift deletion)."""
    mask = tab.shape[1] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if tab[THEAD, j] == -1:
            break
        k = _home(tab[TKEY, j], shift)
        # The row at j stays where it is if its home lies cyclically in (i, j].
        if i <= j:
            if i < k <= j:
                continue
        elif i < k or k <= j:
            continue
        tab[TKEY, i] = tab[TKEY, j]
        tab[THEAD, i] = tab[THEAD, j]
        tab[TTAIL, i] = tab[TTAIL, j]
        i = j
    tab[THEAD, i] = -1


@_compiled
def _unlink(blk, state, s):
    """Take slot ``s`` out of the free queue."""
    p, q = blk[QPREV, s], blk[QNEXT, s]
    if p >= 0:
        blk[QNEXT, p] = q
    else:
        state[QHEAD] = q
    if q >= 0:
        blk[QPREV, q] = p
    else:
        state[QTAIL] = p


@_compiled
def evict(blk, tab, state, count):
    """Take ``count`` blocks from the free queue's front and drop their hashes (their slots carry nothing then).
    -1 if the queue ran out."""
    shift = state[SHIFT]
    for _ in range(count):
        s = state[QHEAD]
        if s < 0:
            return -1
        _unlink(blk, state, s)
        row = _find(tab, blk[KEY, s], shift)
        if row < 0:
            return -1
        head = tab[THEAD, row]
        nxt = blk[CNEXT, s]
        if head == s:
            if nxt == -1:
                _delete_row(tab, row, shift)  # its last copy
            else:
                tab[THEAD, row] = nxt
        else:
            p = head
            while blk[CNEXT, p] != s:
                p = blk[CNEXT, p]
                if p < 0:
                    return -1
            blk[CNEXT, p] = nxt
            if tab[TTAIL, row] == s:
                tab[TTAIL, row] = p
        blk[REF, s] = -1
        blk[STACK, state[TOP]] = s
        state[TOP] += 1
    return 0


@_compiled
def cache(blk, tab, state, shared, position, full, own, serial, out):
    """Hash blocks ``position .. full - 1`` of a request: block ``p`` gets ``shared[p]`` (``p < len(shared)``), else
    ``own + 2 * p``, a free slot, reference count 1 and serial ``serial + p - position``, and becomes its hash's
    youngest copy.  Writes the slots to ``out[:full - position]``; returns the first, or -1 if no slot was free."""
    shift = state[SHIFT]
    num_shared = shared.shape[0]
    for p in range(position, full):
        top = state[TOP] - 1
        if top < 0:
            return -1
        state[TOP] = top
        s = blk[STACK, top]
        key = shared[p] if p < num_shared else own + 2 * p
        blk[KEY, s] = key
        blk[REF, s] = 1
        blk[SERIAL, s] = serial + p - position
        blk[CNEXT, s] = -1
        row = _find(tab, key, shift)
        if row >= 0:
            blk[CNEXT, tab[TTAIL, row]] = s
            tab[TTAIL, row] = s
        else:
            row = ~row
            tab[TKEY, row] = key
            tab[THEAD, row] = s
            tab[TTAIL, row] = s
        out[p - position] = s
    return out[0] if full > position else 0


@_compiled
def lookup(tab, state, shared, own, limit, out):
    """How many leading blocks (at most ``limit``; keys as :func:`cache`'s) some block carries; their oldest
    copies' slots go to ``out``."""
    shift = state[SHIFT]
    num_shared = shared.shape[0]
    for p in range(limit):
        key = shared[p] if p < num_shared else own + 2 * p
        row = _find(tab, key, shift)
        if row < 0:
            return p
        out[p] = tab[THEAD, row]
    return limit


@_compiled
def num_evictable(blk, ids):
    """How many of these slots are in the free queue."""
    n = 0
    for s in ids:
        if s >= 0 and blk[REF, s] == 0:
            n += 1
    return n


@_compiled
def touch(blk, state, ids):
    """Take a reference on each slot, taking the free ones out of the queue; returns how many were free."""
    taken = 0
    for s in ids:
        if s < 0:
            return -1
        count = blk[REF, s]
        if count < 0:
            return -1
        if count == 0:
            _unlink(blk, state, s)
            taken += 1
        blk[REF, s] = count + 1
    return taken


@_compiled
def free(blk, tab, state, ids, own):
    """A request drops its reference on each of its blocks ``ids``, last first (SingleTypeKVCacheManager.free,
    vllm/v1/core/single_type_kv_cache_manager.py, 0.33.0); a block left unreferenced goes to the free queue's back
    (BlockPool.free_blocks).  An id ``~serial`` at position ``p`` is one of its own blocks not in the map yet (see
    PrefixBlockPool.cache_blocks): it gets a slot and its key ``own + 2 * p`` first.  Returns how many were freed."""
    shift = state[SHIFT]
    freed = 0
    for i in range(ids.shape[0] - 1, -1, -1):
        s = ids[i]
        if s < 0:
            top = state[TOP] - 1
            if top < 0:
                return -1
            state[TOP] = top
            serial = ~s
            s = blk[STACK, top]
            key = own + 2 * i
            row = _find(tab, key, shift)
            if row >= 0:
                return -1  # (no block carries a request's own key before its first free)
            row = ~row
            tab[TKEY, row] = key
            tab[THEAD, row] = s
            tab[TTAIL, row] = s
            blk[KEY, s] = key
            blk[REF, s] = 1
            blk[SERIAL, s] = serial
            blk[CNEXT, s] = -1
        count = blk[REF, s] - 1
        if count < 0:
            return -1
        blk[REF, s] = count
        if count == 0:
            tail = state[QTAIL]
            blk[QPREV, s] = tail
            blk[QNEXT, s] = -1
            if tail >= 0:
                blk[QNEXT, tail] = s
            else:
                state[QHEAD] = s
            state[QTAIL] = s
            freed += 1
    return freed


@_compiled
def find_row(tab, state, key):
    """The map row holding ``key``, or -1 (for the pool's views and checks)."""
    row = _find(tab, key, state[SHIFT])
    return row if row >= 0 else -1


def new_state(num_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(blk, tab, state)`` of an empty pool: every slot on the stack (slot 0 popped first)."""
    n = max(num_blocks, 1)
    blk = np.full((BLK_ROWS, n), -1, dtype=np.int64)
    blk[STACK] = np.arange(n - 1, -1, -1)
    bits = max(3, int(2 * n - 1).bit_length())  # 2**bits >= 2 * n
    tab = np.full((3, 1 << bits), -1, dtype=np.int64)
    state = np.array([-1, -1, num_blocks, 64 - bits], dtype=np.int64)
    return blk, tab, state


def warm_up() -> None:
    """Call every kernel once (loads them from numba's cache, or compiles them)."""
    blk, tab, state = new_state(4)
    out = np.zeros(4, dtype=np.int64)
    shared = np.array([6, 6], dtype=np.int64)
    cache(blk, tab, state, shared, 0, 3, 1, 0, out)
    ids = out[:3].copy()
    lookup(tab, state, shared, 1, 3, out)
    ids[2] = ~3  # (one own block not in the map yet)
    free(blk, tab, state, ids, 1)
    num_evictable(blk, ids)
    touch(blk, state, ids[:1])
    evict(blk, tab, state, 2)
    find_row(tab, state, 6)
