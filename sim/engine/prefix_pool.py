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
slots of the arrays that hold their state, and the loops over them are compiled (``sim/engine/_prefix_kernels.py``:
the free queue a linked list, the hash -> copies map an open-addressing table).  Keys are int64 (the runner renames
trace keys beyond it).
The count-based :class:`~sim.engine.kv_cache.GpuBlockPool` stays the pool for prompts that share nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    """``block_hash`` of ``req``'s own block at position 0; its own block at ``p`` has ``own_key + 2 * p``.  Distinct
    across requests because a position stays below 2**24 (``max_model_len`` <= 10M tokens and ``block_size`` >= 8,
    sim/engine/config.py: at most 1.25M blocks)."""
    return (req.index << 25) | 1


class PrefixBlockPool:
    """``num_used + num_cached + num_empty == num_blocks``; ``num_cached`` = free blocks that keep a hash.

    Hashed blocks are slots of arrays, their loops compiled (``sim/engine/_prefix_kernels.py`` describes the
    layout); a request's ``block_ids`` are its hashed blocks' slots, or ``~serial`` for own blocks hashed before
    its first free, which stay out of the arrays until it frees them (see :meth:`cache_blocks`).  :meth:`blocks`,
    :meth:`unmapped`, :meth:`free_queue` and :meth:`all_copies` show the state as plain Python values (tests)."""

    __slots__ = ("num_blocks", "num_used", "num_empty", "num_cached", "enable_caching", "_blk", "_tab", "_state",
                 "_out", "_next_id", "block_size", "_k")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0
        self.num_empty = num_blocks
        self.num_cached = 0
        self.enable_caching = True
        # The kernels' module, imported with the first pool (numba with it: ~0.13 CPU s that a run without
        # shared prefixes does not pay).
        self._k: Any = _kernels()
        self._blk, self._tab, self._state = self._k.new_state(num_blocks)
        #: The kernels' output (cache_blocks hashes at most num_blocks blocks; lookup grows it).
        self._out = np.empty(max(num_blocks, 1), dtype=np.int64)
        #: Blocks hashed so far (the next one's serial).
        self._next_id = 0

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
        if self._k.evict(self._blk, self._tab, self._state, evicted) < 0:
            raise RuntimeError("prefix pool: fewer cached blocks than evicted")
        self.num_cached -= evicted

    def lookup(self, req: Request, limit: int) -> np.ndarray:
        """Ids of the longest run of ``req``'s leading blocks (at most ``limit``) that some block carries, as an
        int64 array: :meth:`num_evictable` and :meth:`touch` take it as it is (converting a list there, twice per
        admission, was ~35% of the elements the prefix case of benchmarks/sim_speed.py turned into arrays)."""
        if limit <= 0:
            return _NONE
        if limit > len(self._out):  # (a repeated key hits one block at several positions)
            self._out = np.empty(limit, dtype=np.int64)
        # A hit takes the oldest copy (BlockHashToBlockMap.get_one_block: the first entry).
        n = self._k.lookup(self._tab, self._state, _shared(req), own_key(req), limit, self._out)
        ids = req.block_ids
        if n < limit and len(ids) > n and not req.blocks_freed and n >= len(req.prefix_keys):
            # Its own blocks not in the map yet (cache_blocks) carry its next keys (only while it holds blocks: the
            # scheduler looks a request up when it holds none).
            return np.concatenate((self._out[:n], np.array(ids[n:limit], dtype=np.int64)))
        return self._out[:n].copy()

    def num_evictable(self, ids: np.ndarray) -> int:
        """How many of these hit blocks (:meth:`lookup`'s) are free (taking them still costs a free block)."""
        return self._k.num_evictable(self._blk, ids) if len(ids) else 0

    def touch(self, req: Request, ids: np.ndarray) -> None:
        """``req`` (holding nothing yet) takes these hit blocks (:meth:`lookup`'s) as its leading blocks."""
        if len(ids):
            taken = self._k.touch(self._blk, self._state, ids)
            if taken < 0:
                raise RuntimeError("prefix pool: touched a block that carries no hash")
            self.num_cached -= taken
            self.num_used += taken
        req.block_ids = ids.tolist()
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
                self._cache(req, ids, _shared(req), position, num_shared, bid)
                ids.extend(range(~(bid + num_shared - position), ~(bid + full - position), -1))
                return
        # Its shared keys (prefix_keys): other requests may hold copies, and a repeated key gets a second one; then
        # its own keys, which only its own earlier blocks may carry (once the pool has freed them).
        self._cache(req, ids, _shared(req) if position < num_shared else _NONE, position, full, bid)

    def _cache(self, req: Request, ids: list[int], shared: np.ndarray, position: int, full: int, bid: int) -> None:
        first = self._k.cache(self._blk, self._tab, self._state, shared, position, full, own_key(req), bid, self._out)
        if first < 0:
            raise RuntimeError("prefix pool: more hashed blocks than blocks")
        if full == position + 1:
            ids.append(first)
        else:
            ids.extend(self._out[:full - position].tolist())

    def free(self, req: Request) -> None:
        """``req`` gives back all its blocks, in reverse order (see the module docstring)."""
        ids = req.block_ids
        unhashed = req.blocks - len(ids)
        freed = (self._k.free(self._blk, self._tab, self._state, np.array(ids, dtype=np.int64), own_key(req))
                 if ids else 0)
        if freed < 0:
            raise RuntimeError("prefix pool: freed a block nobody holds")
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

    def blocks(self) -> dict[int, tuple[int, int, int]]:
        """Every hashed block in the map: slot -> (hash, reference count, serial)."""
        blk = self._blk
        return {s: (int(blk[self._k.KEY, s]), int(blk[self._k.REF, s]), int(blk[self._k.SERIAL, s]))
                for s in np.flatnonzero(blk[self._k.REF] >= 0).tolist()}

    def free_queue(self) -> list[int]:
        """The cached blocks' slots in eviction order, front first (checking the links both ways)."""
        blk, state = self._blk, self._state
        out: list[int] = []
        s, prev = int(state[self._k.QHEAD]), -1
        while s >= 0:
            assert blk[self._k.QPREV, s] == prev and len(out) <= self.num_blocks, "free queue links"
            out.append(s)
            prev, s = s, int(blk[self._k.QNEXT, s])
        assert prev == state[self._k.QTAIL], "free queue tail"
        return out

    def copies_of(self, key: int) -> list[int]:
        """The slots of the blocks carrying ``key``, oldest first."""
        row = int(self._k.find_row(self._tab, self._state, key))
        if row < 0:
            return []
        out: list[int] = []
        blk, s = self._blk, int(self._tab[self._k.THEAD, row])
        while s >= 0:
            assert blk[self._k.KEY, s] == key and blk[self._k.REF, s] >= 0 and len(out) <= self.num_blocks, "copy chain"
            out.append(s)
            s = int(blk[self._k.CNEXT, s])
        assert out[-1] == self._tab[self._k.TTAIL, row], "copy chain tail"
        return out

    def all_copies(self) -> dict[int, list[int]]:
        """Hash -> slots carrying it, oldest first, for every hash in the map (each found by probing, once)."""
        tab = self._tab
        keys = tab[self._k.TKEY, tab[self._k.THEAD] >= 0].tolist()
        assert len(set(keys)) == len(keys), "a hash in two rows"
        out = {key: self.copies_of(key) for key in keys}
        stack = self._blk[self._k.STACK, :int(self._state[self._k.TOP])].tolist()
        assert sorted(stack + [s for held in out.values() for s in held]) == list(range(self.num_blocks)), \
            "every slot is on the stack or carries a hash, once"
        return out


#: The shared keys of a request past them.
_NONE = np.zeros(0, dtype=np.int64)


def _shared(req: Request) -> np.ndarray:
    """``req.prefix_keys`` as an int64 array (made once per request)."""
    keys = req.prefix_array
    if keys is None:
        keys = req.prefix_array = np.array(req.prefix_keys, dtype=np.int64)
    return keys


def _kernels() -> Any:
    from sim.engine import _prefix_kernels

    return _prefix_kernels
