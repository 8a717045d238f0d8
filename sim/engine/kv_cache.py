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
from typing import Any, Final

import numpy as np
from mypy_extensions import i64


class LruBlockStore:
    """Per-request counts of leading full blocks, evicted least-recently-stored first, tail blocks first: the
    ``OrderedDict`` reference that :class:`LinkedLru` (the GPU pool's) and :class:`CpuBlockTier` are tested against
    (tests/sim/engine/test_cpu_tier.py)."""

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
        # (``last`` passed by position: by keyword, the compiled call unpacks the keyword each time.)
        while num_blocks > 0:
            key, have = entries.popitem(False)  # the oldest
            if have > num_blocks:
                entries[key] = have - num_blocks
                entries.move_to_end(key, False)  # still the oldest
                return
            num_blocks -= have


class LinkedLru:
    """:class:`LruBlockStore`'s operations over compiled entries, a doubly linked list over keys (request indices, as
    :class:`CpuBlockTier`'s): the GPU pool's cached blocks (``GpuBlockPool.cache``).  The ``OrderedDict`` calls of
    ``LruBlockStore`` were method calls through the interpreter from the compiled engine (its ``evict`` 4-6% of a cold
    incident or reasoning run, perf); tests/sim/engine/test_cpu_tier.py checks this against it call by call."""

    __slots__ = ("_entries", "_head", "_tail", "num_blocks")

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._head = -1  # the oldest entry's key
        self._tail = -1  # the newest entry's key
        self.num_blocks = 0

    def put(self, key: int, num_blocks: int) -> None:
        """Store ``num_blocks`` leading blocks of ``key`` as the most recent entry (replacing an older one)."""
        entries = self._entries
        if key >= len(entries):
            _grow(entries, key + 1)
        entry = entries[key]
        if entry.count <= 0 and num_blocks <= 0:
            return
        if entry is _UNUSED:
            entry = entries[key] = _Entry()
        if entry.count > 0:
            self.num_blocks -= entry.count
            entry.count = 0
            self._unlink(entry)
        if num_blocks > 0:
            entry.count = num_blocks
            self.num_blocks += num_blocks
            tail = self._tail
            entry.prev = tail
            entry.next = -1
            if tail >= 0:
                entries[tail].next = key
            else:
                self._head = key
            self._tail = key

    def count(self, key: int) -> int:
        return self._entries[key].count if 0 <= key < len(self._entries) else 0

    def take(self, key: int, num_blocks: int) -> int:
        """Remove up to ``num_blocks`` leading blocks of ``key``; returns how many were there (the rest keeps its
        place)."""
        have = self.count(key)
        if have <= 0:
            return 0
        entry = self._entries[key]
        taken = min(have, num_blocks)
        if taken == have:
            entry.count = 0
            self._unlink(entry)
        else:
            entry.count = have - taken
        self.num_blocks -= taken
        return taken

    def evict(self, num_blocks: int) -> None:
        """Drop ``num_blocks`` blocks, oldest entries first (the last one perhaps in part: it stays the oldest)."""
        entries = self._entries
        self.num_blocks -= num_blocks
        while num_blocks > 0:
            head = self._head
            if head < 0:
                raise RuntimeError("LinkedLru: fewer blocks than evicted")
            entry = entries[head]
            have = entry.count
            if have > num_blocks:
                entry.count = have - num_blocks
                return
            entry.count = 0
            self._unlink(entry)
            num_blocks -= have

    def _unlink(self, entry: _Entry) -> None:
        p, q = entry.prev, entry.next
        if p >= 0:
            self._entries[p].next = q
        else:
            self._head = q
        if q >= 0:
            self._entries[q].prev = p
        else:
            self._tail = p
        entry.prev = entry.next = -1

    def items(self) -> list[tuple[int, int]]:
        """``(key, blocks)`` of every entry, oldest first (as ``LruBlockStore.entries.items()`` lists them)."""
        return _chain(self._entries, self._head, "LinkedLru")


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
        self.cache = LinkedLru()
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


class _Entry:
    """One key's place in :class:`CpuBlockTier`: blocks held (0: no entry), the next older and newer entries' keys
    (-1: none), and blocks copied since :meth:`CpuBlockTier.take_copied` last took them.  Fields of a compiled class
    hold ints unboxed, where four ``list[int]`` allocated an int for each key above 256 they stored (the store
    relinks every scheduled request after every step: benchmarks/speed/README.md, the per-case section).  ``i64``:
    machine integers in the compiled engine, without the tag checks of its ``int`` arithmetic (the same values:
    blocks and request indices, far below 2**63)."""

    __slots__ = ("count", "prev", "next", "copied")

    def __init__(self) -> None:
        self.count: i64 = 0
        self.prev: i64 = -1
        self.next: i64 = -1
        self.copied: i64 = 0


#: The one entry every key without an entry of its own points at (count 0, no neighbours, nothing copied; never
#: written: a key gets an :class:`_Entry` of its own when it is first stored, :meth:`CpuBlockTier.put`).  Keys are
#: request indices over the whole workload, so each replica of a fleet sizes its lists by every request the fleet sees:
#: as an object per key that was 2M objects at 64 replicas on the Azure trace, and full garbage collections took
#: 0.63 of a 1.0 s run (64 x round_robin, prefix caching on; issue 31's fleet speed notes).
_UNUSED: Final = _Entry()  # (Final: a C static in the compiled module, not a lookup in its globals per use)


def _grow(entries: list[_Entry], size: int) -> None:
    """Extend ``entries`` in place with :data:`_UNUSED` to at least ``size`` (doubling, 1,024 at least: amortized
    O(1) per key), for :class:`LinkedLru` and :class:`CpuBlockTier`."""
    entries.extend([_UNUSED] * (max(size, 2 * len(entries), 1024) - len(entries)))


class CpuBlockTier:
    """CPU KV memory: an LRU store (V1 offload) with a capacity in blocks, of per-request leading full blocks as
    :class:`LruBlockStore` keeps them, held as a doubly linked list over request indices (compiled by mypyc).

    Write-through offload stores every scheduled request's full blocks after every step (``BaseScheduler.
    _store_computed_blocks``): one put per request, and when the tier holds fewer blocks than the running batch,
    each put evicts other requests' entries; as an ``OrderedDict`` that was most of an offload run's time (py-spy).
    A numba kernel over arrays did these loops until issue 34, but loading numba cost a cold process more than a
    4,000-request run (benchmarks/speed/README.md).  tests/sim/engine/test_cpu_tier.py checks the tier against
    ``LruBlockStore``."""

    __slots__ = ("capacity", "_entries", "_head", "_tail", "_total")

    def __init__(self, capacity: int):
        self.capacity = capacity
        #: Per key (a request index), its :class:`_Entry`; the scheduler adds its copies to
        #: ``Request.swapped_out_blocks`` when the request ends, instead of one Python update per stored request
        #: per step.
        self._entries: list[_Entry] = []
        self._head: i64 = -1  # the oldest entry's key
        self._tail: i64 = -1  # the newest entry's key
        self._total: i64 = 0  # blocks held

    @property
    def num_blocks(self) -> int:
        return self._total

    def offload(self, key: int, num_full_blocks: int) -> int:
        """Keep ``num_full_blocks`` leading blocks of ``key`` on the CPU; returns blocks newly copied."""
        return self.store([key], [num_full_blocks])

    def offload_many(self, keys: Any, fulls: Any) -> np.ndarray:
        """:meth:`offload` for each ``(key, full)`` in turn (sequences or int64 arrays); returns the blocks newly
        copied for each (the scheduler needs only their total, :meth:`store`; tests compare these with the reference
        tier)."""
        keys, fulls = _ints(keys), _ints(fulls)
        news = [0] * len(keys)
        if self.capacity > 0 and keys:
            self._run(keys, fulls, news)
        return np.array(news, dtype=np.int64)

    def store(self, keys: Any, fulls: Any) -> int:
        """:meth:`offload_many` returning only the blocks newly copied in all (the scheduler's store after each
        step: each key's copies are kept for :meth:`take_copied`)."""
        if self.capacity <= 0 or not len(keys):
            return 0
        keys, fulls = _ints(keys), _ints(fulls)
        # Fast path: the leading keys that are the newest entries in the same order (the step before's batch; the
        # keys after them joined the batch since) stored again in place (:meth:`restore`), the rest by ``_run``
        # (the slow path, which relinks every key).  A step's store is its keys stored one after the other, so
        # storing a leading part and then the rest is the same store.
        lead = self._leading(keys)
        if lead:
            stored = self.restore(keys, fulls, lead)
            if stored >= 0:
                return stored + (self._run(keys[lead:], fulls[lead:], None) if lead < len(keys) else 0)
        return self._run(keys, fulls, None)

    def store_step(self, keys: Any, fulls: Any) -> int:
        """:meth:`store` of one step's requests (the scheduler's store after each step).

        Fast path: where the step's blocks (each key's ``min(full, capacity)``, those above 0) exceed the capacity,
        straight to :meth:`_run`, without :meth:`store`'s search for leading keys to :meth:`restore` (``_leading``,
        then ``restore``'s walk): ``restore`` applies only where the keys it stores hold no more than the capacity
        (its evictions must fit in the older entries), and a write-through tier smaller than the running batch
        stored more at ~80% of an offload run's steps, each walk failing at its end (benchmarks/speed/README.md,
        the per-case section).  The leading keys' blocks are a part of the step's; where they alone fit, ``restore``
        could still apply to them, and this store is ``_run``'s instead: the same tier and copies (``store`` is
        its keys stored one after the other either way; tests/sim/engine/test_cpu_tier.py)."""
        if self.capacity <= 0 or not len(keys):
            return 0
        step_keys, counts = _ints(keys), _ints(fulls)  # (typed: ``keys`` and ``fulls`` are Any)
        capacity = self.capacity
        blocks = 0
        for n in counts:
            if n > 0:
                blocks += n if n < capacity else capacity
        if blocks <= capacity:
            return self.store(step_keys, counts)
        return self._run(step_keys, counts, None)

    def _leading(self, keys: list[int]) -> int:
        """1 + the position in ``keys`` of the newest entry's key (0 if absent): the keys that :meth:`restore` may
        store again (it checks the rest of its conditions)."""
        tail = self._tail
        if tail < 0:
            return 0
        for i in range(len(keys) - 1, -1, -1):
            if keys[i] == tail:
                return i + 1
        return 0

    def restore(self, keys: list[int], fulls: list[int], m: int = -1) -> int:
        """Fast path of :meth:`_run` (``news`` None) for the common store: the batch stored again in the order of
        the previous step, each key holding at least one block and growing (or not) within the capacity.  Stores
        the first ``m`` keys (-1: all) and returns the blocks newly copied, or -1 (nothing changed) where it does
        not apply.

        It applies when those keys (distinct, as a step's requests are) are the newest entries, in that order, each
        ``0 < count <= fulls[i] <= capacity``, and the blocks to evict fit in the older entries: storing each key
        in turn moves it to the newest place, so the order ends as it began, and every eviction takes the oldest
        blocks, which are not the batch's (``_run`` would relink every key and evict step by step to the same
        state).  Storing such a batch again with counts that grow again is the same, so a run of decode steps,
        which stores its batch once per step (``BaseScheduler._store_run_blocks``), stores its last step's counts
        once.  tests/sim/engine/test_cpu_tier.py checks both against the reference tier."""
        if m < 0:
            m = len(keys)
        entries = self._entries
        capacity = self.capacity
        size = len(entries)
        key = self._tail
        grown = 0
        batch = 0
        for i in range(m - 1, -1, -1):
            if key < 0 or key != keys[i] or key >= size:
                return -1
            entry = entries[key]
            have = entry.count
            n = fulls[i]
            if have <= 0 or n < have or n > capacity:
                return -1
            grown += n - have
            batch += have
            key = entry.prev
        total = self._total
        evict = total + grown - capacity
        if evict > total - batch:
            return -1  # it would evict some of the batch's own blocks
        for i in range(m):
            entry = entries[keys[i]]
            new = fulls[i] - entry.count
            if new:
                entry.count = fulls[i]
                entry.copied += new
        # the oldest blocks, none of them the batch's
        self._head, self._tail, self._total = self._evict_oldest(evict, self._head, self._tail, total + grown)
        return grown

    def _run(self, keys: list[int], fulls: list[int], news: list[int] | None) -> int:
        """For each ``(keys[i], fulls[i])`` in turn, :meth:`put`; blocks newly copied go to ``news[i]`` (when
        given).  Returns the blocks newly copied in all."""
        stored: i64 = 0
        i: i64 = 0
        for i in range(len(keys)):
            new = self.put(keys[i], fulls[i])
            if news is not None:
                news[i] = new
            stored += new
        return stored

    def put(self, key: i64, n: i64) -> i64:
        """Keep ``min(n, capacity)`` leading blocks of ``key`` as the newest entry (``n <= 0``: nothing), evicting
        the oldest entries' blocks (the last one perhaps in part, which stays the oldest) to stay within
        ``capacity``; blocks newly copied (beyond what the key held before) go to the key's copies
        (:meth:`take_copied`) and are returned.  (``i64``: machine integers in the compiled engine, as ``_Entry``'s
        fields; this runs per stored request per step of a write-through offload run, also called directly by
        ``BaseScheduler._store_computed_blocks`` without lists of boxed keys and counts.)"""
        if n <= 0:
            return 0
        capacity: i64 = self.capacity
        if n > capacity:
            n = capacity
        entries = self._entries
        if key >= len(entries):
            _grow(entries, key + 1)
        entry = entries[key]
        if entry is _UNUSED:  # its first store: an entry of its own
            entry = entries[key] = _Entry()
        head, tail, total = self._head, self._tail, self._total
        have = entry.count
        if have > 0:  # take the key's entry out (it becomes the newest below)
            p, q = entry.prev, entry.next
            if p >= 0:
                entries[p].next = q
            else:
                head = q
            if q >= 0:
                entries[q].prev = p
            else:
                tail = p
            entry.count = 0
            total -= have
        overflow = total + n - capacity
        if overflow > 0:
            head, tail, total = self._evict_oldest(overflow, head, tail, total)
        entry.count = n
        entry.prev = tail
        entry.next = -1
        if tail >= 0:
            entries[tail].next = key
        else:
            head = key
        self._head, self._tail, self._total = head, key, total + n
        new: i64 = 0
        if n > have:
            new = n - have
            entry.copied += new
        return new

    def _evict_oldest(self, count: i64, head: i64, tail: i64, total: i64) -> tuple[i64, i64, i64]:
        """Take ``count`` blocks from the oldest entries, the last one perhaps in part (it then stays the oldest):
        :meth:`put`'s and :meth:`restore`'s eviction, on the list's ends and total as given (the callers hold them
        in locals); returns them as they end.  (A tuple of ``i64``: a C struct in the compiled engine, no boxes.)"""
        entries = self._entries
        while count > 0:
            if head < 0:
                raise AssertionError("CpuBlockTier: blocks to evict are missing from its entry list")
            old = entries[head]
            held = old.count
            if held <= 0:
                raise AssertionError("CpuBlockTier: blocks to evict are missing from its entry list")
            if held > count:  # the oldest entry loses its tail blocks and stays the oldest
                old.count = held - count
                total -= count
                break
            q = old.next
            head = q
            if q >= 0:
                entries[q].prev = -1
            else:
                tail = -1
            old.count = 0
            total -= held
            count -= held
        return head, tail, total

    def take_copied(self, key: int) -> int:
        """Blocks copied for ``key`` since the last call (0 if none), and forget them."""
        if key >= len(self._entries):
            return 0
        entry = self._entries[key]
        n = entry.copied
        if n:
            entry.copied = 0
        return n

    def cached_prefix(self, key: int) -> int:
        return self._entries[key].count if key < len(self._entries) else 0

    def entries(self) -> list[tuple[int, int]]:
        """``(key, blocks)`` of every entry, oldest first (as ``LruBlockStore.entries`` would list them)."""
        return _chain(self._entries, self._head, "CpuBlockTier")


def _chain(entries: list[_Entry], head: int, owner: str) -> list[tuple[int, int]]:
    """``(key, blocks)`` along a linked list of :class:`_Entry` from ``head``, oldest first (:class:`LinkedLru` and
    :class:`CpuBlockTier`); AssertionError naming ``owner`` if the list has a cycle."""
    out: list[tuple[int, int]] = []
    key = head
    while key >= 0:
        out.append((key, entries[key].count))
        key = entries[key].next
        if len(out) > len(entries):
            raise AssertionError(f"{owner}: its entry list has a cycle")
    return out


def _ints(values: Any) -> list[int]:
    """A sequence of ints (a list as it is, an int64 array or another sequence as a new list of ints)."""
    if isinstance(values, list):
        return values
    if isinstance(values, np.ndarray):
        return values.tolist()
    return [int(v) for v in values]
