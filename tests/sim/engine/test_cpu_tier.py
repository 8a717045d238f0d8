"""The CPU KV tier (sim/engine/kv_cache.py CpuBlockTier: an LRU of per-request leading full blocks, as arrays with a
compiled store pass) against the OrderedDict tier it replaced (kept here as the reference, built on
LruBlockStore): random sequences of stores, one at a time and a step's worth at once, and prefix lookups give the
same returns and the same entries in the same order after every call, and each key's copies taken back
(``take_copied``, what the scheduler adds to ``Request.swapped_out_blocks`` when a request ends) are the sum of
its stores' returns since it was last taken."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.kv_cache import CpuBlockTier, LinkedLru, LruBlockStore


class ReferenceTier:
    """CpuBlockTier as of 9e736f9: one LruBlockStore.put / evict per store."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.store = LruBlockStore()

    def offload(self, key: int, num_full_blocks: int) -> int:
        if self.capacity <= 0 or num_full_blocks <= 0:
            return 0
        num_full_blocks = min(num_full_blocks, self.capacity)
        have = self.store.count(key)
        new = max(0, num_full_blocks - have)
        overflow = self.store.num_blocks - have + num_full_blocks - self.capacity
        self.store.put(key, 0)
        if overflow > 0:
            self.store.evict(overflow)
        self.store.put(key, num_full_blocks)
        return new

    def cached_prefix(self, key: int) -> int:
        return self.store.count(key)


keys = st.integers(0, 40)
fulls = st.integers(-1, 30)
ops = st.lists(st.one_of(
    st.tuples(st.just("one"), keys, fulls),
    st.tuples(st.just("many"), st.lists(st.tuples(keys, fulls), max_size=12)),
    st.tuples(st.just("store"), st.lists(st.tuples(keys, fulls), max_size=12)),
    st.tuples(st.just("lookup"), st.integers(0, 5000)),
    st.tuples(st.just("take"), st.one_of(keys, st.integers(0, 5000))),
), max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(capacity=st.integers(0, 60), calls=ops)
def test_cpu_tier_matches_the_ordered_dict_tier(capacity, calls):
    tier, ref = CpuBlockTier(capacity), ReferenceTier(capacity)
    pending: dict[int, int] = {}  # copies per key not yet taken
    for call in calls:
        if call[0] == "one":
            new = ref.offload(call[1], call[2])
            assert tier.offload(call[1], call[2]) == new
            pending[call[1]] = pending.get(call[1], 0) + new
        elif call[0] in ("many", "store"):
            pairs = call[1]
            if call[0] == "many":
                got = tier.offload_many([k for k, _ in pairs], [n for _, n in pairs]).tolist()
            else:  # the scheduler's store: only the total comes back
                got = tier.store(np.array([k for k, _ in pairs], dtype=np.int64), [n for _, n in pairs])
            news = [ref.offload(k, n) for k, n in pairs]
            assert got == (news if call[0] == "many" else sum(news))
            for (k, _), new in zip(pairs, news):
                pending[k] = pending.get(k, 0) + new
        elif call[0] == "take":
            assert tier.take_copied(call[1]) == pending.pop(call[1], 0)
        else:
            assert tier.cached_prefix(call[1]) == ref.cached_prefix(call[1])
        assert tier.entries() == list(ref.store.entries.items())
        assert tier.num_blocks == ref.store.num_blocks <= max(capacity, 0)


def test_a_store_into_a_full_tier_evicts_the_oldest_entries_tail_first():
    tier = CpuBlockTier(10)
    assert tier.offload_many([1, 2], [4, 6]).tolist() == [4, 6]
    assert tier.offload(3, 3) == 3  # evicts 3 of request 1's 4 blocks: its leading block stays, still oldest
    assert tier.entries() == [(1, 1), (2, 6), (3, 3)]
    assert tier.offload(2, 7) == 1  # request 2 becomes the newest; one more block evicts request 1 whole
    assert tier.entries() == [(3, 3), (2, 7)]
    assert [tier.take_copied(k) for k in (1, 2, 3, 2)] == [4, 7, 3, 0]  # taken once
    assert tier.cached_prefix(1) == 0 and tier.cached_prefix(99) == 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(capacity=st.integers(0, 60), calls=ops, batch=st.lists(st.tuples(keys, fulls), max_size=12, unique_by=lambda p: p[0]),
       growth=st.lists(st.lists(st.integers(-1, 6), min_size=12, max_size=12), max_size=6))
def test_storing_the_batch_again_matches_the_ordered_dict_tier(capacity, calls, batch, growth):
    """The same batch stored again in the same order, each count changed by a small amount (a step after a step:
    ``CpuBlockTier.restore``'s fast path where it applies), after random other stores."""
    tier, ref = CpuBlockTier(capacity), ReferenceTier(capacity)
    for call in calls:
        if call[0] in ("many", "store", "one"):
            pairs = [(call[1], call[2])] if call[0] == "one" else call[1]
            assert tier.store([k for k, _ in pairs], [n for _, n in pairs]) == sum(ref.offload(k, n) for k, n in pairs)
    batch_keys = [k for k, _ in batch]
    counts = [n for _, n in batch]
    for deltas in [[0] * 12, *growth]:
        counts = [n + d for n, d in zip(counts, deltas)]
        before = tier.entries()
        fast = tier.restore(batch_keys, counts)
        if fast < 0:
            assert tier.entries() == before  # nothing changed where it does not apply
            fast = tier.store(batch_keys, counts)
        assert fast == sum(ref.offload(k, n) for k, n in zip(batch_keys, counts))
        assert tier.entries() == list(ref.store.entries.items())
        assert tier.num_blocks == ref.store.num_blocks


@settings(max_examples=300, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 80), calls=ops, batch=st.lists(st.tuples(keys, st.integers(0, 40)), min_size=1,
       max_size=12, unique_by=lambda p: p[0]), num_steps=st.integers(2, 40), block_size=st.integers(1, 8))
def test_a_run_stored_once_at_its_last_step_matches_step_by_step(capacity, calls, batch, num_steps, block_size):
    """A decode run's stores (``BaseScheduler._store_run_blocks``): its first step stored, then, where
    ``restore`` applies, its last step's counts at once; the tier and the copies equal storing every step."""
    tiers = [CpuBlockTier(capacity), CpuBlockTier(capacity)]
    for tier in tiers:
        for call in calls:
            if call[0] in ("many", "store"):
                tier.store([k for k, _ in call[1]], [n for _, n in call[1]])
    batch_keys = [k for k, _ in batch]
    tokens = [t + num_steps for _, t in batch]  # tokens computed after the run
    step = [[(t - back) // block_size for t in tokens] for back in range(num_steps - 1, -1, -1)]
    fast, slow = tiers
    copied = fast.store(batch_keys, step[0])
    last = fast.restore(batch_keys, step[-1])
    if last >= 0:
        copied += last
    else:
        copied += sum(fast.store(batch_keys, counts) for counts in step[1:])
    assert copied == sum(slow.store(batch_keys, counts) for counts in step)
    assert fast.entries() == slow.entries()
    assert [fast.take_copied(k) for k in range(41)] == [slow.take_copied(k) for k in range(41)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(calls=st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 40), st.integers(-1, 30)),
    st.tuples(st.just("take"), st.integers(0, 2000), st.integers(0, 30)),
    st.tuples(st.just("evict"), st.integers(0, 1000)),
    st.tuples(st.just("count"), st.integers(0, 2000)),
), max_size=80))
def test_the_gpu_pools_linked_lru_matches_lru_block_store(calls):
    """``LinkedLru`` (the GPU pool's cached blocks) against the ``OrderedDict`` store it replaced, call by call."""
    lru, ref = LinkedLru(), LruBlockStore()
    for call in calls:
        if call[0] == "put":
            lru.put(call[1], call[2])
            ref.put(call[1], call[2])
        elif call[0] == "take":
            assert lru.take(call[1], call[2]) == ref.take(call[1], call[2])
        elif call[0] == "evict":
            n = call[1] % (ref.num_blocks + 1)  # (the pool evicts only blocks it has)
            lru.evict(n)
            ref.evict(n)
        else:
            assert lru.count(call[1]) == ref.count(call[1])
        assert lru.items() == list(ref.entries.items())
        assert lru.num_blocks == ref.num_blocks


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 6)), min_size=1, max_size=40),
       capacity=st.integers(1, 20))
def test_only_stored_keys_get_entries_of_their_own(keys, capacity):
    """Keys are request indices over a whole workload (a fleet's replica sees a few of many): the lists are sized by
    the largest key, but a key gets an entry object only when it is stored, and the shared empty entry is never
    written (issue 31: one object per key was 2M objects at 64 replicas)."""
    from sim.engine import kv_cache

    unused = kv_cache._UNUSED
    tier, lru = CpuBlockTier(capacity), LinkedLru()
    for key, blocks in keys:
        tier.offload(key, blocks)
        lru.put(key, blocks)
        lru.take(key + 1, 1)
        tier.take_copied(key + 2)
    for store in (tier, lru):
        own = {id(e) for e in store._entries if e is not unused}
        stored = {key for key, blocks in keys if blocks > 0}
        assert len(own) == len(stored)
    assert (unused.count, unused.prev, unused.next, unused.copied) == (0, -1, -1, 0)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(capacity=st.integers(0, 60), calls=st.lists(st.one_of(
    st.tuples(st.just("step"), st.lists(st.tuples(keys, st.integers(-1, 30)), max_size=14, unique_by=lambda p: p[0])),
    st.tuples(st.just("store"), st.lists(st.tuples(keys, fulls), max_size=12)),
    st.tuples(st.just("lookup"), keys),
), max_size=40))
def test_a_steps_store_beyond_the_capacity_matches_store(capacity, calls):
    """``CpuBlockTier.store_step`` (the scheduler's store: a step's distinct keys; where their blocks exceed the
    capacity, ``_run`` without ``store``'s search for a leading part to ``restore``) against ``store`` and the
    reference tier, call by call, copies taken back at the end."""
    tier, slow, ref = CpuBlockTier(capacity), CpuBlockTier(capacity), ReferenceTier(capacity)
    for call in calls:
        if call[0] == "lookup":
            assert tier.cached_prefix(call[1]) == slow.cached_prefix(call[1]) == ref.cached_prefix(call[1])
            continue
        ks, ns = [k for k, _ in call[1]], [n for _, n in call[1]]
        news = sum(ref.offload(k, n) for k, n in call[1])
        assert (tier.store_step if call[0] == "step" else tier.store)(ks, ns) == news
        assert slow.store(ks, ns) == news
        assert tier.entries() == slow.entries() == list(ref.store.entries.items())
        assert tier.num_blocks == ref.store.num_blocks
    assert [tier.take_copied(k) for k in range(41)] == [slow.take_copied(k) for k in range(41)]
