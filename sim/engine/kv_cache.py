"""Paged KV memory, counted per request rather than per block so that work grows with events, not tokens.

GPU pool (vllm/v1/core/block_pool.py, 0.33.0): blocks are *used* (held by a running request), *cached* (free,
but still holding a finished or preempted request's full blocks, evictable in LRU order) or *empty*.
``free = empty + cached``; allocation takes empty blocks first, then evicts the least recently freed cached
blocks.  vLLM frees a request's blocks in reverse order, so eviction eats a request's tail blocks first and
its leading blocks (the ones a resumed request re-hits) survive longest.  vLLM keeps empty and cached
blocks in one free queue, but ``BlockPool.free_blocks`` puts blocks without a hash (partial tail blocks,
and every block when caching is off) at its front and hashed ones at its back, so it too hands out empty
blocks before evicting cached ones, in the same order as here (checked step by step against vLLM 0.33.0 by
benchmarks/conformance).

CPU tier (V1 ``--kv-offloading-size``): an LRU store of requests' full blocks with its own capacity.
Swap space (V0 ``--swap-space``): a plain counter; swap-out fails when it is exhausted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np


class LruBlockStore:
    """Per-request counts of leading full blocks, evicted least-recently-stored first, tail blocks first."""

    __slots__ = ("entries", "num_blocks")

    def __init__(self) -> None:
        self.entries: OrderedDict[int, int] = OrderedDict()
        self.num_blocks = 0

    def put(self, key: int, num_blocks: int) -> None:
        """Store ``num_blocks`` leading blocks of ``key`` as the most recent entry (replacing an older one)."""
        old = self.entries.pop(key, 0)
        self.num_blocks -= old
        if num_blocks > 0:
            self.entries[key] = num_blocks
            self.num_blocks += num_blocks

    def count(self, key: int) -> int:
        return self.entries.get(key, 0)

    def take(self, key: int, num_blocks: int) -> int:
        """Remove up to ``num_blocks`` leading blocks of ``key``; returns how many were there."""
        have = self.entries.get(key, 0)
        taken = min(have, num_blocks)
        if taken == have:
            self.entries.pop(key, None)
        else:
            self.entries[key] = have - taken
        self.num_blocks -= taken
        return taken

    def evict(self, num_blocks: int) -> None:
        """Drop ``num_blocks`` blocks, oldest entries first."""
        entries = self.entries
        self.num_blocks -= num_blocks
        while num_blocks > 0:
            key, have = entries.popitem(last=False)
            if have > num_blocks:
                entries[key] = have - num_blocks
                entries.move_to_end(key, last=False)  # still the oldest
                return
            num_blocks -= have


class GpuBlockPool:
    """The GPU's usable KV blocks: ``num_used + num_cached + num_empty == num_blocks`` at all times.

    For prompts that share nothing: a request's cached blocks can only be re-hit by itself.  Shared prefixes
    (trace ``hash_ids``) use :class:`~sim.engine.prefix_pool.PrefixBlockPool`, block by block.
    """

    __slots__ = ("num_blocks", "num_used", "num_empty", "cache", "enable_caching")

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks = num_blocks
        self.num_used = 0
        self.num_empty = num_blocks
        self.cache = LruBlockStore()
        self.enable_caching = enable_caching

    @property
    def num_cached(self) -> int:
        return self.cache.num_blocks

    @property
    def num_free(self) -> int:
        return self.num_empty + self.cache.num_blocks

    def allocate(self, num_blocks: int) -> None:
        """Hand out ``num_blocks`` free blocks; the caller has checked they are there."""
        if num_blocks <= 0:
            return
        from_empty = min(num_blocks, self.num_empty)
        self.num_empty -= from_empty
        rest = num_blocks - from_empty
        if rest:
            self.cache.evict(rest)
        self.num_used += num_blocks

    def release(self, key: int, num_blocks: int, num_full_blocks: int) -> None:
        """A request gives back its blocks; with caching its ``num_full_blocks`` leading ones stay cached."""
        self.num_used -= num_blocks
        cached = min(num_full_blocks, num_blocks) if self.enable_caching else 0
        if cached:
            self.cache.put(key, cached)
        self.num_empty += num_blocks - cached

    def cached_prefix(self, key: int) -> int:
        return self.cache.count(key) if self.enable_caching else 0

    def reuse_cached(self, key: int, num_blocks: int) -> int:
        """A resumed request re-hits its own surviving cached blocks: they become used again."""
        hit = self.cache.take(key, num_blocks)
        self.num_used += hit
        return hit


class CpuBlockTier:
    """CPU KV memory: an LRU store (V1 offload) with a capacity in blocks, of per-request counts of leading full
    blocks as :class:`LruBlockStore` keeps them, held as arrays over request indices with a compiled store pass
    (``sim/engine/_lru_kernels.py``)."""

    __slots__ = ("capacity", "_count", "_prev", "_next", "_copied", "_state", "_news", "_k")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._count = np.zeros(0, dtype=np.int64)  # blocks held per key (0: no entry)
        self._prev = np.zeros(0, dtype=np.int64)  # the next older entry's key (-1: none)
        self._next = np.zeros(0, dtype=np.int64)  # the next newer entry's key (-1: none)
        #: Blocks copied per key since :meth:`take_copied` last took them: the scheduler adds them to
        #: ``Request.swapped_out_blocks`` when the request ends, instead of one Python update per stored request
        #: per step.
        self._copied = np.zeros(0, dtype=np.int64)
        self._state = np.array([-1, -1, 0], dtype=np.int64)  # oldest key, newest key, total blocks
        self._news = np.zeros(256, dtype=np.int64)  # the kernel's per-key output for :meth:`store`
        self._k: Any = None  # sim.engine._lru_kernels, imported at the first store (numba loads then)

    @property
    def num_blocks(self) -> int:
        return int(self._state[2])

    def offload(self, key: int, num_full_blocks: int) -> int:
        """Keep ``num_full_blocks`` leading blocks of ``key`` on the CPU; returns blocks newly copied."""
        return self.store([key], [num_full_blocks])

    def offload_many(self, keys, fulls) -> np.ndarray:
        """:meth:`offload` for each ``(key, full)`` in turn (sequences of ints); returns the blocks newly copied for
        each (the scheduler needs only their total, :meth:`store`; tests compare these with the reference tier)."""
        keys = np.asarray(keys, dtype=np.int64)
        news = np.zeros(len(keys), dtype=np.int64)
        if self.capacity > 0 and len(keys):
            self._run(keys, fulls, news)
        return news

    def store(self, keys, fulls) -> int:
        """:meth:`offload_many` returning only the blocks newly copied in all (the scheduler's store after each
        step: each key's copies are kept for :meth:`take_copied`)."""
        if self.capacity <= 0 or not len(keys):
            return 0
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) > len(self._news):
            self._news = np.zeros(2 * len(keys), dtype=np.int64)
        return self._run(keys, fulls, self._news)

    def _run(self, keys: np.ndarray, fulls, news: np.ndarray) -> int:
        if self._k is None:
            from sim.engine import _lru_kernels

            self._k = _lru_kernels
        fulls = np.asarray(fulls, dtype=np.int64)
        stored = self._k.offload_many(keys, fulls, news, self._count, self._prev, self._next, self._state,
                                      self.capacity, self._copied)
        if stored < -1:  # a key beyond the arrays (checked before any change): grow them, then store
            self._grow(-stored - 1)
            stored = self._k.offload_many(keys, fulls, news, self._count, self._prev, self._next, self._state,
                                          self.capacity, self._copied)
        if stored < 0:
            raise AssertionError("CpuBlockTier: blocks to evict are missing from its entry list")
        return stored

    def _grow(self, size: int) -> None:
        size = max(size, 2 * len(self._count), 1024)
        old = len(self._count)
        count = np.zeros(size, dtype=np.int64)
        prev = np.full(size, -1, dtype=np.int64)
        nxt = np.full(size, -1, dtype=np.int64)
        copied = np.zeros(size, dtype=np.int64)
        count[:old], prev[:old], nxt[:old], copied[:old] = self._count, self._prev, self._next, self._copied
        self._count, self._prev, self._next, self._copied = count, prev, nxt, copied

    def take_copied(self, key: int) -> int:
        """Blocks copied for ``key`` since the last call (0 if none), and forget them."""
        copied = self._copied
        if key >= len(copied):
            return 0
        n = int(copied[key])
        if n:
            copied[key] = 0
        return n

    def cached_prefix(self, key: int) -> int:
        return int(self._count[key]) if key < len(self._count) else 0

    def entries(self) -> list[tuple[int, int]]:
        """``(key, blocks)`` of every entry, oldest first (as ``LruBlockStore.entries`` would list them)."""
        out, key = [], int(self._state[0])
        while key >= 0:
            out.append((key, int(self._count[key])))
            key = int(self._next[key])
            if len(out) > len(self._count):
                raise AssertionError("CpuBlockTier: its entry list has a cycle")
        return out
