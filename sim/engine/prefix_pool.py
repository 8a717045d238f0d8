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

Blocks without a hash are interchangeable, so they are only counted (``num_empty``); hashed blocks have ids.
The count-based :class:`~sim.engine.kv_cache.GpuBlockPool` stays the pool for prompts that share nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import chain

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
    """``num_used + num_cached + num_empty == num_blocks``; ``num_cached`` = free blocks that keep a hash."""

    __slots__ = ("num_blocks", "num_used", "num_empty", "enable_caching", "free_hashed", "copies", "hash_of",
                 "ref", "_next_id", "block_size")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0
        self.num_empty = num_blocks
        self.enable_caching = True
        #: Free blocks that keep their hash, in eviction order (front first).
        self.free_hashed: OrderedDict[int, None] = OrderedDict()
        #: hash -> ids of the blocks carrying it, oldest first.
        self.copies: dict[int, dict[int, None]] = {}
        self.hash_of: dict[int, int] = {}
        #: Reference count of every hashed block (0: it is in ``free_hashed``).
        self.ref: dict[int, int] = {}
        self._next_id = 0

    @property
    def num_cached(self) -> int:
        return len(self.free_hashed)

    @property
    def num_free(self) -> int:
        return self.num_empty + len(self.free_hashed)

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
        pop, hash_pop, copies, ref = self.free_hashed.popitem, self.hash_of.pop, self.copies, self.ref
        for _ in range(num_blocks - from_empty):
            bid = pop(False)[0]
            key = hash_pop(bid)
            del ref[bid]
            held = copies[key]
            if len(held) == 1:
                del copies[key]  # its last copy (held is {bid: None})
            else:
                del held[bid]

    def lookup(self, req: Request, limit: int) -> list[int]:
        """Ids of the longest run of ``req``'s leading blocks (at most ``limit``) that some block carries."""
        copies = self.copies
        get = copies.get
        keys = req.prefix_keys
        out: list[int] = []
        append = out.append
        # Its shared keys are prefix_keys (block_hash's even keys), read without a block_hash call per block;
        # a hit takes the oldest copy (BlockHashToBlockMap.get_one_block: the first entry).
        for key in keys[:limit]:
            held = get(key)
            if held is None:
                return out
            append(next(iter(held)))
        for position in range(len(keys), limit):
            held = get(block_hash(req, position))
            if held is None:
                break
            append(next(iter(held)))
        return out

    def num_evictable(self, ids: list[int]) -> int:
        """How many of these hit blocks are free (taking them still costs a free block)."""
        return list(map(self.ref.__getitem__, ids)).count(0)

    def touch(self, req: Request, ids: list[int]) -> None:
        """``req`` (holding nothing yet) takes these hit blocks as its leading blocks."""
        ref, free = self.ref, self.free_hashed
        taken = 0
        for bid in ids:
            count = ref[bid]
            if not count:
                del free[bid]
                taken += 1
            ref[bid] = count + 1
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
        # Until the pool first frees a request's blocks, every block carrying one of its own keys is one it holds,
        # at that key's position (below len(ids)), so no block carries the own keys hashed here yet.
        own_fresh = not req.blocks_freed
        own = own_key(req)
        copies, hash_of, ref = self.copies, self.hash_of, self.ref
        bid = self._next_id
        self._next_id = bid + full - position
        shared = req.prefix_keys
        if own_fresh and full == position + 1 and position >= len(shared):
            # Fast path for the loops below, for a decode step filling one own block (most calls).
            key = own + 2 * position
            hash_of[bid] = key
            ref[bid] = 1
            copies[key] = {bid: None}
            ids.append(bid)
            return
        append = ids.append
        # Its shared keys (prefix_keys): other requests may hold copies, and a repeated key gets a second one; then
        # its own keys, which only its own earlier blocks may carry (once the pool has freed them).
        stop = full if full < len(shared) else len(shared)
        own_from = position if position > stop else stop
        keys = shared[position:stop]
        if not own_fresh:
            keys = chain(keys, (block_hash(req, p) for p in range(own_from, full)))
        for key in keys:
            hash_of[bid] = key
            ref[bid] = 1
            held = copies.get(key)
            if held is None:
                copies[key] = {bid: None}
            else:
                held[bid] = None
            append(bid)
            bid += 1
        if own_fresh:
            # Fast path for the copies lookup above (see above: no block carries these keys yet).
            for key in range(own + 2 * own_from, own + 2 * full, 2):
                hash_of[bid] = key
                ref[bid] = 1
                copies[key] = {bid: None}
                append(bid)
                bid += 1

    def free(self, req: Request) -> None:
        """``req`` gives back all its blocks, in reverse order (see the module docstring)."""
        ids = req.block_ids
        unhashed = req.blocks - len(ids)
        ref, free = self.ref, self.free_hashed
        freed = 0
        for bid in reversed(ids):
            count = ref[bid] - 1
            ref[bid] = count
            if not count:
                free[bid] = None
                freed += 1
        self.num_used -= unhashed + freed
        self.num_empty += unhashed
        req.block_ids = []
        req.blocks = 0
        req.blocks_freed = True
