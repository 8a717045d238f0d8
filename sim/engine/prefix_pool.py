"""The GPU block pool block by block, for workloads whose prompts share prefixes (trace ``hash_ids``).

It follows vLLM 0.33.0's ``BlockPool`` (vllm/v1/core/block_pool.py) and ``FullAttentionManager``
(v1/core/single_type_kv_cache_manager.py) wherever a scheduling decision depends on it:

- a block gets its hash when ``allocate_slots`` hands it out, for every block that is full once this step's
  scheduled tokens are computed (``kv_cache_manager.allocate_slots`` -> ``coordinator.cache_blocks(request,
  min(computed + new, request.num_tokens))``), so a request admitted later in the same ``schedule()`` call
  hits blocks an earlier one is still prefilling;
- several physical blocks may carry one hash (two requests computed the same block): each copy stays the
  private block of the request that computed it until freed, and a lookup takes the oldest copy still alive
  (``BlockHashToBlockMap.get_one_block``);
- a request's blocks are freed in reverse order (``SingleTypeKVCacheManager.free``): blocks without a hash go
  to the front of the free queue, hashed ones to its back, tail first (``BlockPool.free_blocks``), so
  eviction takes a request's tail before its prefix;
- allocation pops the front of the free queue and drops the hash of a cached block it takes
  (``BlockPool.get_new_blocks``); a hit on a free block takes it out of the queue (``BlockPool.touch``).

Blocks without a hash are interchangeable, so they are only counted (``num_empty``); hashed blocks have ids, the
*slots* ``[0, num_blocks)``, each an object that holds its state (hashed blocks, used or cached, never outnumber the
pool's blocks): per slot its hash, its reference count (0: in the free queue; -1: the slot carries no block), its
serial (when it was hashed: the pool's running count of hashed blocks; orders copies, names blocks in tests), its
free queue neighbours (a doubly linked list, front = next evicted) and the next younger copy of its hash; a stack of
the slots carrying no block; and a dict from each hash to its oldest copy (a new copy walks the chain to its end:
copies of one hash are few).  The loops over them
are compiled by mypyc (sim/_compiled.py): numba kernels over arrays did the same, but loading numba cost a cold
process more than a 4,000-request run (benchmarks/speed/README.md, issue 34).  Keys are Python ints.
The count-based :class:`~sim.engine.kv_cache.GpuBlockPool` stays the pool for prompts that share nothing.
"""

from __future__ import annotations

from typing import Final, cast

from sim.engine.request import Request


def block_hash(req: Request, position: int) -> int:
    """The content key of block ``position`` of ``req``: its trace prefix key when it has one (even: the runner
    stores them doubled in ``prefix_keys``), else a key no other request has (odd; output tokens and the prompt
    beyond its hash ids are the request's own)."""
    keys = req.prefix_keys
    if position < len(keys):
        return keys[position]
    return own_key(req) + 2 * position


def own_key(req: Request) -> int:
    """``block_hash`` of ``req``'s own block at position 0; its own block at ``p`` has ``own_key + 2 * p``: ``index *
    2**25 + 1 + 2 * (offset + p)`` with an offset below 2**23, distinct across requests because a position stays
    below 2**23 (``max_model_len`` <= 10M tokens and ``block_size`` >= 8, sim/engine/config.py: at most 1.25M blocks).
    The offset (the index times an odd constant, mod 2**23) varies the keys' low bits from request to request: a
    dict places an int key by its low bits, and keys that differed only from bit 25 up collided there (dict lookups
    were 14% of the prefix case's CPU, perf, 2026-12-06)."""
    index = req.index
    return (index << 25) | (1 + 2 * ((index * 0x9E3779B1) & 0x7FFFFF))


# Where the loops below read a key from a request's tuple or a slot from the map, they keep it as the int object it
# is (typed ``object``; slots hold their key so too): typed ``int``, the compiled module unboxes it and boxes it
# again for the dict or list it goes to, allocating a new int for each value above 256 (callgrind of the prefix case,
# 2026-12-07: ~90 instructions a box, two or three boxes a block in ``lookup`` and ``_cache``, and the map's equality
# checks between equal ints that are not the same object).  ``cast`` costs a type check of the container, nothing
# else.

#: A slot's ``ids`` when it is not a run entry.  ``Final`` (here and for the other constants read on the engine's
#: per-step paths): a C static in the compiled module, not a lookup in its globals dict at each read.
_NO_IDS: Final[list[int]] = []


class _Slot:
    """One slot's state (see the module docstring): its hash, reference count (0: in the free queue; -1: it carries
    no block), serial, free queue neighbours and next younger copy of its hash (slot ids, -1: none).  Fields of a
    compiled class hold ints unboxed, where a ``list[int]`` allocated an int for each slot id above 256 it stored
    (as CpuBlockTier's ``_Entry``, sim/engine/kv_cache.py).

    A slot with ``run`` > 0 is instead one entry of the free queue for ``run`` cached blocks of an ended request that
    nobody can hit (see :meth:`PrefixBlockPool.free`): its own blocks at positions ``first .. first + run - 1`` of
    ``ids`` (its block ids when it ended, ``~serial`` each), with keys ``own + 2 * position``, evicted from the
    last position down, as they were freed."""

    __slots__ = ("key", "ref", "serial", "qprev", "qnext", "cnext", "run", "first", "own", "ids")

    def __init__(self) -> None:
        self.key: object = -1  # an int, kept as the object the map holds (see lookup)
        self.ref = -1
        self.serial = -1
        self.qprev = -1
        self.qnext = -1
        self.cnext = -1
        self.run = 0
        self.first = 0
        self.own = 0
        self.ids: list[int] = _NO_IDS


class PrefixBlockPool:
    """``num_used + num_cached + num_empty == num_blocks``; ``num_cached`` = free blocks that keep a hash.

    Hashed blocks are slots (the module docstring describes them); a request's ``block_ids`` are its hashed
    blocks' slots, or ``~serial`` for own blocks hashed before its first free, which stay out of the map until it
    frees them (see :meth:`cache_blocks`).  :meth:`blocks`, :meth:`unmapped`, :meth:`free_queue` and
    :meth:`all_copies` show the state as plain Python values (tests).  Every operation raises ``RuntimeError`` where
    it finds the state broken (never, while the invariants hold)."""

    __slots__ = ("num_blocks", "num_used", "num_empty", "num_cached", "enable_caching", "block_size", "_next_id",
                 "_slots", "_stack", "_top", "_qhead", "_qtail",
                 "_oldest")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0
        self.num_empty = num_blocks
        self.num_cached = 0
        self.enable_caching = True
        #: Blocks hashed so far (the next one's serial).
        self._next_id = 0
        n = max(num_blocks, 1)
        self._slots: list[_Slot] = [_Slot() for _ in range(n)]
        #: The slots carrying no block: the first ``_top``, the last one popped first (slot 0 first).
        self._stack: list[int] = list(range(n - 1, -1, -1))
        self._top = num_blocks
        self._qhead = -1  # the free queue's front (next evicted) and back
        self._qtail = -1
        #: Hash -> the slot of its oldest copy (the one a lookup hits; its younger ones follow ``_cnext``).
        self._oldest: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return self.num_empty + self.num_cached

    def allocate(self, num_blocks: int) -> None:
        """Hand out ``num_blocks`` blocks without a hash: empty ones first, then the oldest cached ones."""
        if num_blocks <= 0:
            return
        from_empty = min(num_blocks, self.num_empty)
        self.num_empty -= from_empty
        self.num_used += num_blocks
        if num_blocks == from_empty:
            return
        # Eviction pops the free queue's front and drops the block's hash (BlockPool.get_new_blocks and
        # _maybe_evict_cached_block, vllm/v1/core/block_pool.py, 0.33.0).
        evicted = num_blocks - from_empty
        self._evict(evicted)
        self.num_cached -= evicted

    def _evict(self, count: int) -> None:
        """Take ``count`` blocks from the free queue's front and drop their hashes (their slots carry nothing).  A run
        entry (an ended request's own blocks, see :meth:`free`) gives its blocks from its count; its hashes are in no
        map (fast path: the block-by-block path below pops each block's hash)."""
        slots = self._slots
        oldest = cast("dict[object, int]", self._oldest)
        while count > 0:
            s = self._qhead
            if s < 0:
                raise RuntimeError("prefix pool: fewer cached blocks than evicted")
            slot = slots[s]
            run = slot.run
            if run > count:
                slot.run = run - count
                return
            q = slot.qnext
            self._qhead = q
            if q >= 0:
                slots[q].qprev = -1
            else:
                self._qtail = -1
            if run:
                count -= run
                slot.run = 0
                slot.ids = _NO_IDS
            else:
                count -= 1
                key = slot.key
                head = oldest.pop(key, -1)
                if head < 0:
                    raise RuntimeError("prefix pool: a cached block's hash is not in the map")
                nxt = slot.cnext
                if head == s:
                    if nxt != -1:
                        oldest[key] = nxt
                else:
                    oldest[key] = head
                    p = head
                    while slots[p].cnext != s:
                        p = slots[p].cnext
                        if p < 0:
                            raise RuntimeError("prefix pool: a cached block is not on its hash's copies")
                    slots[p].cnext = nxt
            slot.ref = -1
            self._stack[self._top] = s
            self._top += 1

    def _append(self, s: int) -> None:
        """Put slot ``s`` at the free queue's back (evicted last)."""
        slot = self._slots[s]
        tail = self._qtail
        slot.qprev = tail
        slot.qnext = -1
        if tail >= 0:
            self._slots[tail].qnext = s
        else:
            self._qhead = s
        self._qtail = s

    def _unlink(self, s: int) -> None:
        """Take slot ``s`` out of the free queue."""
        slot = self._slots[s]
        p, q = slot.qprev, slot.qnext
        if p >= 0:
            self._slots[p].qnext = q
        else:
            self._qhead = q
        if q >= 0:
            self._slots[q].qprev = p
        else:
            self._qtail = p

    def lookup(self, req: Request, limit: int) -> list[int]:
        """Ids of the longest run of ``req``'s leading blocks (at most ``limit``) that some block carries (a new
        list: :meth:`num_evictable` and :meth:`touch` take it)."""
        out: list[object] = []
        if limit > 0:
            # Keys and slots stay the int objects the tuple and the map hold (see the comment above _NO_IDS).
            keys: tuple[object, ...] = req.prefix_keys
            num_shared = len(keys)
            own = own_key(req)
            oldest = cast("dict[object, object]", self._oldest)
            # A hit takes the oldest copy (BlockHashToBlockMap.get_one_block: the first entry).
            for p in range(limit):
                s = oldest.get(keys[p] if p < num_shared else own + 2 * p)
                if s is None:
                    break
                out.append(s)
            n = len(out)
            ids = req.block_ids
            if n < limit and len(ids) > n and not req.blocks_freed and n >= num_shared:
                # Its own blocks not in the map yet (cache_blocks) carry its next keys (only while it holds blocks:
                # the scheduler looks a request up when it holds none).
                out.extend(ids[n:limit])
        return cast("list[int]", out)

    def num_evictable(self, ids: list[int]) -> int:
        """How many of these hit blocks (:meth:`lookup`'s) are free (taking them still costs a free block)."""
        slots = self._slots
        n = 0
        for s in ids:
            if s >= 0 and slots[s].ref == 0:
                n += 1
        return n

    def touch(self, req: Request, ids: list[int]) -> None:
        """``req`` (holding nothing yet) takes these hit blocks (:meth:`lookup`'s) as its leading blocks."""
        slots = self._slots
        taken = 0
        for s in ids:
            count = slots[s].ref if s >= 0 else -1
            if count < 0:
                raise RuntimeError("prefix pool: touched a block that carries no hash")
            if count == 0:
                self._unlink(s)
                taken += 1
            slots[s].ref = count + 1
        self.num_cached -= taken
        self.num_used += taken
        req.block_ids = list(ids)
        req.blocks = len(ids)

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Give hashes to ``req``'s blocks that are full once ``num_tokens`` tokens are computed."""
        ids = req.block_ids
        position = len(ids)
        full = num_tokens // self.block_size
        if full <= position:
            return
        bid = self._next_id
        self._next_id = bid + full - position
        num_shared = len(req.prefix_keys)
        if not req.blocks_freed:
            # Until the pool first frees a request's blocks, its own keys (own_key + 2 * position, past its shared
            # ones) are carried only by the blocks it holds, which nobody else can hit and it cannot look up while
            # it holds them: such a block is only named, ``~serial``, and enters the map when freed (free).
            if position >= num_shared:
                if full == position + 1:
                    ids.append(~bid)  # (most calls: a decode step filling one own block)
                else:
                    ids.extend(range(~bid, ~(bid + full - position), -1))
                return
            if full > num_shared:
                self._cache(req, ids, position, num_shared, bid)
                ids.extend(range(~(bid + num_shared - position), ~(bid + full - position), -1))
                return
        # Its shared keys (prefix_keys): other requests may hold copies, and a repeated key gets a second one; then
        # its own keys, which only its own earlier blocks may carry (once the pool has freed them).
        self._cache(req, ids, position, full, bid)

    def _cache(self, req: Request, ids: list[int], position: int, full: int, bid: int) -> None:
        """Hash blocks ``position .. full - 1`` of ``req`` (shared keys, then its own): each gets a free slot,
        reference count 1 and the next serial, and becomes its hash's youngest copy; their slots go to ``ids``."""
        shared = req.prefix_keys
        num_shared = len(shared)
        own = own_key(req)
        slots, stack = self._slots, self._stack
        # The key, and the slot once boxed, as objects (see the comment above _NO_IDS).
        keys: tuple[object, ...] = shared
        oldest = cast("dict[object, object]", self._oldest)
        out = cast("list[object]", ids)
        for p in range(position, full):
            top = self._top - 1
            if top < 0:
                raise RuntimeError("prefix pool: more hashed blocks than blocks")
            self._top = top
            s = stack[top]
            key = keys[p] if p < num_shared else own + 2 * p
            slot = slots[s]
            slot.key = key
            slot.ref = 1
            slot.serial = bid + p - position
            slot.cnext = -1
            boxed: object = s
            last = oldest.setdefault(key, boxed)
            if last is not boxed:  # the hash's youngest copy until now gets this one next
                copy = cast(int, last)
                while slots[copy].cnext != -1:
                    copy = slots[copy].cnext
                slots[copy].cnext = s
            out.append(boxed)

    def free(self, req: Request, final: bool = False) -> None:
        """``req`` gives back all its blocks, in reverse order (SingleTypeKVCacheManager.free,
        vllm/v1/core/single_type_kv_cache_manager.py, 0.33.0); a block left unreferenced goes to the free queue's
        back (BlockPool.free_blocks).  An id ``~serial`` at position ``p`` is one of its own blocks not in the map
        yet (see :meth:`cache_blocks`): it gets a slot and its key ``own_key + 2 * p`` first.

        ``final``: ``req`` has ended (finished or aborted) and is never looked up again.  Its own blocks not in the
        map (a tail of its ids, freed first) then carry keys nobody can look up: only their place in the free queue
        matters (what eviction takes, and when), so they go to the queue's back as one run entry (:class:`_Slot`),
        consecutive as block by block, with no hash in the map.  Fast path: block by block (below, and for a
        request that will be looked up again) each took a slot and a map entry here and gave them back at
        eviction (``free`` and ``_evict`` were ~25% of the prefix case, perf)."""
        ids = req.block_ids
        unhashed = req.blocks - len(ids)
        freed = 0
        if ids:
            own = own_key(req)
            slots, stack = self._slots, self._stack
            oldest = cast("dict[object, int]", self._oldest)
            last = len(ids) - 1
            if final and ids[last] < 0:
                first = last
                while first > 0 and ids[first - 1] < 0:
                    first -= 1
                top = self._top - 1
                if top < 0:
                    raise RuntimeError("prefix pool: more hashed blocks than blocks")
                self._top = top
                s = stack[top]
                slot = slots[s]
                slot.run = last - first + 1
                slot.first = first
                slot.own = own
                slot.ids = ids
                slot.ref = 0
                self._append(s)
                freed = last - first + 1
                last = first - 1
            for i in range(last, -1, -1):
                s = ids[i]
                if s < 0:
                    top = self._top - 1
                    if top < 0:
                        raise RuntimeError("prefix pool: more hashed blocks than blocks")
                    self._top = top
                    number = ~s
                    s = stack[top]
                    key: object = own + 2 * i  # boxed once, for the map and the slot
                    if oldest.setdefault(key, s) != s:
                        raise RuntimeError("prefix pool: a request's own key has a copy before its first free")
                    slot = slots[s]
                    slot.key = key
                    slot.ref = 1
                    slot.serial = number
                    slot.cnext = -1
                slot = slots[s]
                count = slot.ref - 1
                if count < 0:
                    raise RuntimeError("prefix pool: freed a block nobody holds")
                slot.ref = count
                if count == 0:
                    self._append(s)
                    freed += 1
        self.num_cached += freed
        self.num_used -= unhashed + freed
        self.num_empty += unhashed
        req.block_ids = []
        req.blocks = 0
        req.blocks_freed = True

    # ---- the state as Python values (tests) ------------------------------------------------------------
    @staticmethod
    def unmapped(req: Request) -> list[tuple[int, int, int]]:
        """``req``'s own blocks not in the map yet (cache_blocks): (id, hash, serial); each has reference count 1
        and is its hash's only copy."""
        own = own_key(req)
        return [(bid, own + 2 * p, ~bid) for p, bid in enumerate(req.block_ids) if bid < 0]

    def _runs(self) -> list[_Slot]:
        """The run entries of the free queue (see :meth:`free`), front first."""
        out: list[_Slot] = []
        s = self._qhead
        while s >= 0:
            slot = self._slots[s]
            if slot.run:
                out.append(slot)
            s = slot.qnext
        return out

    @staticmethod
    def _run_blocks(slot: _Slot) -> list[tuple[int, int, int]]:
        """A run entry's blocks in eviction order: (id ``~serial``, hash, serial), each cached (reference count 0)."""
        ids = slot.ids
        return [(ids[p], slot.own + 2 * p, ~ids[p]) for p in range(slot.first + slot.run - 1, slot.first - 1, -1)]

    def blocks(self) -> dict[int, tuple[int, int, int]]:
        """Every hashed block: slot -> (hash, reference count, serial); a run entry's blocks (see :meth:`free`) by
        their ids ``~serial``, as if they were in the map."""
        out = {s: (cast(int, slot.key), slot.ref, slot.serial) for s, slot in enumerate(self._slots) if slot.ref >= 0 and not slot.run}
        for slot in self._runs():
            out.update((bid, (key, 0, serial)) for bid, key, serial in self._run_blocks(slot))
        return out

    def free_queue(self) -> list[int]:
        """The cached blocks' slots in eviction order, front first (checking the links both ways); a run entry's
        blocks by their ids (see :meth:`blocks`)."""
        out: list[int] = []
        s, prev = self._qhead, -1
        while s >= 0:
            slot = self._slots[s]
            assert slot.qprev == prev and len(out) <= self.num_blocks, "free queue links"
            if slot.run:
                out.extend(bid for bid, _, _ in self._run_blocks(slot))
            else:
                out.append(s)
            prev, s = s, slot.qnext
        assert prev == self._qtail, "free queue tail"
        return out

    def copies_of(self, key: int) -> list[int]:
        """The slots of the blocks carrying ``key`` in the map, oldest first."""
        out: list[int] = []
        s = self._oldest.get(key, -1)
        while s >= 0:
            slot = self._slots[s]
            assert slot.key == key and slot.ref >= 0 and len(out) <= self.num_blocks, "copy chain"
            out.append(s)
            s = slot.cnext
        return out

    def all_copies(self) -> dict[int, list[int]]:
        """Hash -> blocks carrying it, oldest first, for every hash in the map and every run entry's block (its
        hash's only copy)."""
        out = {key: self.copies_of(key) for key in self._oldest}
        runs = self._runs()
        stack = self._stack[:self._top]
        run_slots = [s for s, slot in enumerate(self._slots) if slot.run]
        assert len(run_slots) == len(runs), "a run entry outside the free queue"
        assert sorted(stack + run_slots + [s for held in out.values() for s in held]) == list(range(self.num_blocks)), \
            "every slot is on the stack, a run entry or carries a hash, once"
        for slot in runs:
            for bid, key, _ in self._run_blocks(slot):
                assert key not in out, "a run entry's block has another copy"
                out[key] = [bid]
        return out
