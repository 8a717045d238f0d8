"""The CPU KV tier's LRU as arrays, and its store pass compiled (numba, ``cache=True``, as
``sim/engine/_column_kernels.py``).

Write-through offload stores every scheduled request's full blocks after every step (``BaseScheduler.
_store_computed_blocks`` and ``_store_segment_blocks``): one put per request, and when the tier holds fewer blocks
than the running batch, each put evicts other requests' entries; as an ``OrderedDict`` that was most of an offload
run's time (py-spy).  Here the LRU is a doubly linked list over request indices: ``count[key]`` (0: no entry),
``prev`` / ``nxt`` (-1: none) and ``state = [head (oldest), tail (newest), total blocks]``.  The operations are ``LruBlockStore``'s
(``sim/engine/kv_cache.py``), in the same order; tests/sim/engine/test_cpu_tier.py checks them against it.
"""

from __future__ import annotations

import numpy as np

from sim.engine._column_kernels import _compiled

_HEAD, _TAIL, _TOTAL = 0, 1, 2


@_compiled
def offload_many(keys, fulls, news, count, prev, nxt, state, capacity, copied):
    """For each ``(keys[i], fulls[i])`` in turn: keep ``min(fulls[i], capacity)`` leading blocks of the key as the
    newest entry, evicting the oldest entries' blocks (the last one perhaps in part, which stays the oldest) to
    stay within ``capacity``; ``news[i]``: blocks newly copied (beyond what the key held before), also added to
    ``copied[key]`` (the key's copies not yet taken by ``CpuBlockTier.take_copied``).  Returns the blocks newly
    copied in all; ``-(top + 2)`` without changing anything if key ``top`` (the largest) is beyond the arrays (the
    caller grows them and calls again); -1 if the blocks to evict were not on the list (never, while its
    invariants hold)."""
    top = -1
    for i in range(keys.shape[0]):
        if keys[i] > top:
            top = keys[i]
    if top >= count.shape[0]:
        return -(top + 2)
    head, tail, total = state[_HEAD], state[_TAIL], state[_TOTAL]
    stored = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        n = fulls[i]
        if n <= 0:
            news[i] = 0
            continue
        if n > capacity:
            n = capacity
        have = count[key]
        if have > 0:  # take the key's entry out (it becomes the newest below)
            p, q = prev[key], nxt[key]
            if p >= 0:
                nxt[p] = q
            else:
                head = q
            if q >= 0:
                prev[q] = p
            else:
                tail = p
            count[key] = 0
            total -= have
        overflow = total + n - capacity
        while overflow > 0:
            old = head
            held = count[old] if old >= 0 else 0
            if held <= 0:
                return -1  # the list lost entries (a broken invariant): the caller raises
            if held > overflow:
                count[old] = held - overflow
                total -= overflow
                break
            q = nxt[old]
            head = q
            if q >= 0:
                prev[q] = -1
            else:
                tail = -1
            count[old] = 0
            total -= held
            overflow -= held
        count[key] = n
        prev[key] = tail
        nxt[key] = -1
        if tail >= 0:
            nxt[tail] = key
        else:
            head = key
        tail = key
        total += n
        new = n - have if n > have else 0
        news[i] = new
        copied[key] += new
        stored += new
    state[_HEAD], state[_TAIL], state[_TOTAL] = head, tail, total
    return stored


def warm_up() -> None:
    """Call the kernel once (loads it from numba's cache, or compiles it)."""
    count = np.zeros(2, dtype=np.int64)
    links = np.full(2, -1, dtype=np.int64)
    state = np.array([-1, -1, 0], dtype=np.int64)
    offload_many(np.array([0, 1], dtype=np.int64), np.array([2, 1], dtype=np.int64), np.zeros(2, dtype=np.int64),
                 count, links, links.copy(), state, 2, np.zeros(2, dtype=np.int64))
