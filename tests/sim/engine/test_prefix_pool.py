"""The shared-prefix block pool's fast paths (sim/engine/prefix_pool.py) and the runner's vectorized prefix hashes
(sim/request_store.py) against their straightforward versions: random sequences of the scheduler's pool calls (admission
with lookup and touch, growth with hashing, preemption and end frees, eviction) leave both pools in the same
state, and the one-pass hashes equal the per-request loop's."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.engine.prefix_pool import PrefixBlockPool, block_hash
from sim.engine.request import Request
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.request_store import _int64_keys, _key_tuples, _prefix_hash_array, _prefix_hashes_loop
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload

BLOCK = 4


class ReferencePool:
    """PrefixBlockPool's methods as of a95f957, block by block (only the doubling of the shared keys moved to the
    runner), with its state as of 016a765 (dicts: block ids are serials, a free queue as an OrderedDict)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used = 0
        self.num_empty = num_blocks
        self.free_hashed: OrderedDict[int, None] = OrderedDict()
        self.copies: dict[int, dict[int, None]] = {}
        self.hash_of: dict[int, int] = {}
        self.ref: dict[int, int] = {}
        self._next_id = 0

    @property
    def num_cached(self) -> int:
        return len(self.free_hashed)

    @property
    def num_free(self) -> int:
        return self.num_empty + len(self.free_hashed)

    def allocate(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            return
        from_empty = min(num_blocks, self.num_empty)
        self.num_empty -= from_empty
        free, hash_of, copies, ref = self.free_hashed, self.hash_of, self.copies, self.ref
        for _ in range(num_blocks - from_empty):
            bid, _ = free.popitem(last=False)
            key = hash_of.pop(bid)
            del ref[bid]
            held = copies[key]
            del held[bid]
            if not held:
                del copies[key]
        self.num_used += num_blocks

    def lookup(self, req: Request, limit: int) -> list[int]:
        out = []
        for position in range(limit):
            held = self.copies.get(block_hash(req, position))
            if held is None:
                break
            out.append(next(iter(held)))
        return out

    def num_evictable(self, ids: list[int]) -> int:
        return sum(1 for bid in ids if self.ref[bid] == 0)

    def touch(self, req: Request, ids: list[int]) -> None:
        for bid in ids:
            count = self.ref[bid]
            if count == 0:
                del self.free_hashed[bid]
                self.num_used += 1
            self.ref[bid] = count + 1
        req.block_ids = list(ids)
        req.blocks = len(ids)

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        ids = req.block_ids
        full = num_tokens // self.block_size
        for position in range(len(ids), full):
            bid = self._next_id
            self._next_id = bid + 1
            key = block_hash(req, position)
            self.hash_of[bid] = key
            self.ref[bid] = 1
            held = self.copies.get(key)
            if held is None:
                self.copies[key] = {bid: None}
            else:
                held[bid] = None
            ids.append(bid)

    def free(self, req: Request) -> None:
        ids = req.block_ids
        unhashed = req.blocks - len(ids)
        self.num_used -= unhashed
        self.num_empty += unhashed
        for bid in reversed(ids):
            count = self.ref[bid] - 1
            self.ref[bid] = count
            if count == 0:
                self.free_hashed[bid] = None
                self.num_used -= 1
        req.block_ids = []
        req.blocks = 0


def _state(pool, reqs) -> tuple:
    return (pool.num_used, pool.num_empty, pool.num_cached, list(pool.free_hashed), pool._next_id,
            dict(pool.hash_of), dict(pool.ref), {key: list(held) for key, held in pool.copies.items()},
            [(r.blocks, list(r.block_ids)) for r in reqs])


def _serials(pool: PrefixBlockPool, reqs) -> dict[int, int]:
    """Block id -> serial (its id in the reference pool), for the blocks in the map and those not in it yet."""
    serial = {s: ser for s, (_, _, ser) in pool.blocks().items()}
    serial.update((bid, ser) for r in reqs for bid, _, ser in pool.unmapped(r))
    assert len(set(serial.values())) == len(serial), "two blocks with one serial"
    return serial


def _array_state(pool: PrefixBlockPool, reqs) -> tuple:
    """The array pool's state in the reference's terms: each block named by its serial (its id there)."""
    blocks = list(pool.blocks().values())
    unmapped = [entry for r in reqs for entry in pool.unmapped(r)]
    blocks += [(key, 1, ser) for _, key, ser in unmapped]
    serial = _serials(pool, reqs)
    copies = {key: [serial[s] for s in held] for key, held in pool.all_copies().items()}  # (checks map and stack)
    for _, key, ser in unmapped:
        assert key not in copies, "an own block not in the map yet has a copy in it"
        copies[key] = [ser]
    return (pool.num_used, pool.num_empty, pool.num_cached, [serial[s] for s in pool.free_queue()], pool._next_id,
            {ser: key for key, _, ser in blocks}, {ser: ref for _, ref, ser in blocks}, copies,
            [(r.blocks, [serial[s] for s in r.block_ids]) for r in reqs])


#: Trace keys the shared ones are made of: negative and large ones too (the pool's map hashes int64 keys).
TRACE_KEYS = (0, 1, 2, -3, (1 << 61) - 1, -(1 << 61))


def _requests(prefixes) -> list[Request]:
    return [Request(i, i, "a", 0.0, 1000, 10, 10_000, prefix_keys=tuple(2 * TRACE_KEYS[k] for k in keys))
            for i, keys in enumerate(prefixes)]


@st.composite
def pool_runs(draw):
    # Few distinct shared keys, so requests share prefixes, repeat a key, or diverge part way.
    prefixes = draw(st.lists(st.lists(st.integers(0, 5), max_size=8), min_size=2, max_size=5))
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "lookup", "end"]), st.integers(0, 4),
                                  st.integers(0, 12), st.integers(0, 12), st.integers(0, BLOCK - 1)), min_size=10, max_size=80))
    return prefixes, draw(st.integers(4, 24)), ops


@settings(max_examples=300, deadline=None, derandomize=True)
@given(run=pool_runs())
def test_pool_fast_paths_match_the_block_by_block_pool(run):
    prefixes, num_blocks, ops = run
    # (Freeing a request and admitting it again sends its later hashing down the slow path.)
    fast, slow = PrefixBlockPool(num_blocks, BLOCK), ReferencePool(num_blocks, BLOCK)
    fast_reqs, slow_reqs = _requests(prefixes), _requests(prefixes)
    ended: set[int] = set()
    for op, which, size, fill, step in ops:
        which %= len(prefixes)
        if which in ended:
            continue  # (an ended request is never looked up or given blocks again)
        if op == "lookup":
            serial = _serials(fast, fast_reqs)
            assert [serial[s] for s in fast.lookup(fast_reqs[which], size)] == slow.lookup(slow_reqs[which], size)
            continue
        for pool, reqs in ((fast, fast_reqs), (slow, slow_reqs)):
            req = reqs[which]
            if op == "admit" and not req.blocks:
                # _admit / _take_blocks: hit blocks, fresh ones up to total, then hash the computed ones
                # (step < BLOCK tokens more never fill another block).
                hits = pool.lookup(req, size)
                free_after_touch = pool.num_free - pool.num_evictable(hits)
                total = len(hits) + min(size, free_after_touch)
                pool.touch(req, hits)
                pool.allocate(total - len(hits))
                req.blocks = total
                pool.cache_blocks(req, min(len(hits) + fill, total) * BLOCK + step)
            elif op == "grow" and req.blocks:
                # A running request's step: fresh blocks, then hash the full ones (a decode fills one).
                need = min(size, pool.num_free)
                pool.allocate(need)
                req.blocks += need
                pool.cache_blocks(req, min(len(req.block_ids) + fill % 3, req.blocks) * BLOCK + step)
            elif op == "free":
                pool.free(req)
            elif op == "end":
                # The request ended (finished or aborted): the fast pool keeps its own blocks not in the map as one
                # free-queue entry (PrefixBlockPool.free's ``final``); the reference frees them block by block.
                if isinstance(pool, PrefixBlockPool):
                    pool.free(req, final=True)
                else:
                    pool.free(req)
        if op == "end":
            ended.add(which)
        assert _array_state(fast, fast_reqs) == _state(slow, slow_reqs)
        assert fast.num_used + fast.num_cached + fast.num_empty == num_blocks



def test_the_reference_pool_has_its_own_version_of_every_method_compared():
    # (It inherits only the pool's state: an inherited method would compare the fast path with itself.)
    assert {"allocate", "lookup", "num_evictable", "touch", "cache_blocks", "free"} <= set(vars(ReferencePool))

@st.composite
def hash_columns(draw):
    block_size = draw(st.sampled_from([8, 16, 32]))
    hash_block_tokens = block_size * draw(st.sampled_from([1, 2, 4]))
    n = draw(st.integers(0, 12))
    big = draw(st.sampled_from([100, 2**40, (1 << 62) // (hash_block_tokens // block_size), 2**63 - 1]))
    ints = st.integers(-big, big)
    row = st.one_of(st.none(), st.lists(ints, max_size=6), st.lists(ints, max_size=6).map(np.array))
    column = np.empty(n, dtype=object)
    column[:] = [draw(row) for _ in range(n)] if n else []
    prompts = np.array(draw(st.lists(st.integers(1, 40 * block_size), min_size=n, max_size=n)), dtype=np.int64)
    return column, prompts, block_size, hash_block_tokens


def _prefix_hashes(column, prompts, block_size, hash_block_tokens):
    """The vectorized keys as one tuple per request (the loop's form), or None where it falls back to the loop."""
    found = _prefix_hash_array(column, prompts, block_size, hash_block_tokens)
    return None if found is None else _key_tuples(found[0], found[1])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=hash_columns())
def test_vectorized_prefix_hashes_match_the_loop(case):
    column, prompts, block_size, hash_block_tokens = case
    fast = _prefix_hashes(column, prompts, block_size, hash_block_tokens)
    slow = _prefix_hashes_loop(column, prompts, block_size, hash_block_tokens)
    if fast is None:
        # Only ids whose hashes could leave int64 (or that are not int64) fall back to the loop.
        ids = [int(i) for row in column if row is not None for i in row]
        assert max(map(abs, ids)) > (1 << 62) // (hash_block_tokens // block_size) - 1
    else:
        assert fast == slow
        assert all(type(key) is int for keys in fast for key in keys)


def test_vectorized_prefix_hashes_take_ordinary_traces():
    column = np.empty(3, dtype=object)
    column[:] = [[5, 6], None, [5, 7, 9]]
    prompts = np.array([40, 10, 20], dtype=np.int64)
    assert _prefix_hashes(column, prompts, 8, 16) == _prefix_hashes_loop(column, prompts, 8, 16) == [
        (20, 22, 24, 26), (), (20, 22)]


def test_keys_beyond_int64_are_renamed_alike():
    keys = [(2 << 64, 4, 2 << 64), (), (-(2 << 70), 4)]
    renamed = _int64_keys(keys)
    assert [len(row) for row in renamed] == [3, 0, 2]
    flat, new = [k for row in keys for k in row], [k for row in renamed for k in row]
    assert all(-(1 << 63) <= k < 1 << 63 and k % 2 == 0 for k in new)
    assert [[a == b for b in flat] for a in flat] == [[a == b for b in new] for a in new]
    small = [(2, 4), (-6,)]
    assert _int64_keys(small) is small


# ---- a request's keys that no other key equals: the pool takes them as its own (request_store.pool_lengths) -----

def _keyed_run(rows, ids, num_blocks: int, late_ids: list[int] | None):
    """``rows`` with trace ``hash_ids`` ``ids`` (64 tokens an id, 4 blocks of 16) on ``num_blocks`` blocks; with
    ``late_ids``, one more request arrives long after the others ended, listing those ids twice on a one-block
    prompt: every id then occurs at least twice, so the store keeps every key of every request (no pool length
    cut)."""
    rows, ids = list(rows), list(ids)
    if late_ids is not None:
        rows.append((1e6, 16, 1))
        ids.append(late_ids + late_ids)
    wl = make_workload(rows)
    wl.requests["hash_ids"] = ids
    config = EngineConfig(enable_prefix_caching=True, num_gpu_blocks_override=num_blocks, max_model_len=512,
                          max_num_batched_tokens=256, max_num_seqs=16)
    sim = Simulation(wl, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), hash_block_tokens=64)
    return sim, sim.run()


@st.composite
def keyed_workloads(draw):
    n = draw(st.integers(2, 14))
    rows, ids, next_id = [], [], 1000
    for i in range(n):
        shared = draw(st.lists(st.integers(0, 5), max_size=3))  # a few ids many requests list (or twice)
        own = draw(st.integers(0, 4))
        row_ids = shared + list(range(next_id, next_id + own))
        next_id += own
        prompt = draw(st.integers(1, max(1, 64 * len(row_ids) + 40)))
        rows.append((0.02 * draw(st.integers(0, 40)), prompt, draw(st.integers(1, 60))))
        ids.append(row_ids)
    return rows, ids, draw(st.integers(34, 80)), list(range(0, 6)) + list(range(1000, next_id))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(case=keyed_workloads())
def test_keys_only_one_request_has_decide_as_its_own_keys(case):
    """The same run, block for block, whether each request's keys that no other key equals are kept (the late
    request lists every id, so none is unique) or taken by the pool as the request's own keys (cut off by
    ``pool_lengths``): same request rows, same steps before the late arrival."""
    rows, ids, num_blocks, every_id = case
    cut_sim, cut = _keyed_run(rows, ids, num_blocks, None)
    kept_sim, kept = _keyed_run(rows, ids, num_blocks, every_id)
    assert kept_sim.store.pool_lengths is None
    n = len(rows)
    pd.testing.assert_frame_equal(cut.requests.iloc[:n].reset_index(drop=True),
                                  kept.requests.iloc[:n].reset_index(drop=True))
    steps = kept.steps[kept.steps["start_s"] < 1e6 - 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(cut.steps.reset_index(drop=True), steps)


def test_pool_lengths_cut_each_request_after_its_last_shared_id():
    # Ids 1 and 2 are listed twice (2 twice by one request); 7, 8, 9 and 10 once.  4 blocks an id.
    rows = [(0.0, 64 * 3, 4), (0.0, 64 * 2 + 20, 4), (0.0, 64 * 2, 4), (0.0, 30, 4)]
    ids = [[1, 7, 8], [2, 2, 9], [1, 10], []]
    sim, _ = _keyed_run(rows, ids, 200, None)
    # request 0: id 1 shared -> 4 keys of 12; request 1: ids 2, 2 -> 8 of 9 (its prompt covers 9 blocks); request 2:
    # id 1 -> 4 of 8; request 3: no ids.
    assert sim.store.pool_lengths == [4, 8, 4, 0]
    assert [len(k) for k in sim.store.keys] == [12, 9, 8, 0]
    assert [len(sim.store.request(i).prefix_keys) for i in range(4)] == [4, 8, 4, 0]
