"""Shared prefixes (trace ``hash_ids``): blocks another request computed are re-hit, and held once."""

from __future__ import annotations

from sim.engine.config import EngineConfig
from sim.engine.prefix_pool import block_hash
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload


def _sim(rows, hashes, **knobs):
    workload = make_workload(rows)
    workload.requests["hash_ids"] = hashes
    knobs.setdefault("max_model_len", 1024)
    config = EngineConfig(enable_prefix_caching=True, **knobs)
    return Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                      latency=LinearStepModel(0.01, 1e-5), hash_block_tokens=64)


def test_second_request_rehits_a_finished_requests_prefix():
    # Same two 64-token hash blocks (128 tokens = 8 blocks of 16); the second arrives after the first ended.
    sim = _sim([(0.0, 200, 3), (5.0, 200, 3)], [[1, 2], [1, 2]])
    table = sim.run().requests.set_index("request_id")
    assert table.loc[0, "prefix_hit_tokens"] == 0
    assert table.loc[1, "prefix_hit_tokens"] == 128
    first, second = sim.requests
    assert second.processed_tokens == first.processed_tokens - 128


def test_no_hit_without_prefix_caching_or_on_another_prefix():
    table = _sim([(0.0, 200, 3), (5.0, 200, 3)], [[1, 2], [7, 8]]).run().requests
    assert table["prefix_hit_tokens"].sum() == 0
    workload = make_workload([(0.0, 200, 3), (5.0, 200, 3)])
    workload.requests["hash_ids"] = [[1, 2], [1, 2]]
    sim = Simulation(workload, EngineConfig(max_model_len=1024, enable_prefix_caching=False),
                     load_model("Llama-3-8B"), load_gpu("H100-SXM"), latency=LinearStepModel(0.01, 1e-5),
                     hash_block_tokens=64)
    assert sim.run().requests["prefix_hit_tokens"].sum() == 0


def test_concurrent_requests_hold_a_shared_prefix_once():
    # The second request arrives while the first decodes (long output): its 8 prefix blocks are shared.
    sim = _sim([(0.0, 200, 400), (0.5, 200, 400)], [[1, 2], [1, 2]])
    used = []
    sim.core.observer = lambda i, now, out: used.append(
        (len(sim.core.scheduler.running), sim.core.scheduler.pool.num_used,
         [list(r.block_ids) for r in sim.core.scheduler.running]))
    sim.run()
    both = [(n, u, ids) for n, u, ids in used if n == 2]
    assert both, "the two requests should run together"
    n, u, (first_ids, second_ids) = both[0]
    assert first_ids[:8] == second_ids[:8], "the second request holds the first one's 8 prefix blocks"
    assert not set(first_ids[8:]) & set(second_ids[8:])
    blocks_each = sum(r.kv_blocks_peak for r in sim.requests) // 2
    assert u < 2 * blocks_each, "shared blocks are counted once"


def test_a_request_admitted_in_the_same_step_hits_blocks_still_being_prefilled():
    # vLLM 0.33.0 hashes blocks when allocate_slots hands them out: the second request, admitted in the same
    # schedule() call as the first, already hits the first one's 8 prefix blocks.
    sim = _sim([(0.0, 200, 3), (0.0, 200, 3)], [[1, 2], [1, 2]], max_num_batched_tokens=2048)
    table = sim.run().requests.set_index("request_id")
    assert table.loc[0, "prefix_hit_tokens"] == 0
    assert table.loc[1, "prefix_hit_tokens"] == 128


def test_eviction_takes_a_freed_requests_tail_before_its_shared_prefix():
    # vLLM frees a request's blocks in reverse order (v1/core/single_type_kv_cache_manager.py, 0.33.0).
    # 39 usable blocks (40 - the null block).  Request 0 (hash id 1 = 4 blocks, then its own) ends holding 13
    # blocks, 12 of them full (hashed).  Request 1's unique 550-token prompt then takes 35 blocks: the 27 empty
    # ones and 8 cached ones, which must be request 0's own tail blocks, so its 4 prefix blocks survive for
    # request 2.
    sim = _sim([(0.0, 200, 3), (1.0, 550, 2), (1.1, 100, 2)], [[1], [], [1]],
               num_gpu_blocks_override=40, max_num_batched_tokens=2048, max_model_len=600)
    table = sim.run().requests.set_index("request_id")
    assert table.loc[2, "prefix_hit_tokens"] == 64, "request 0's leading blocks are evicted last"


def test_lookup_takes_the_oldest_copy_of_a_block():
    # Long-prefill cap 32: in step 0 request 0 computes blocks 0-1, request 1 hits them and computes blocks
    # 2-3 itself; in step 1 request 0 computes its own copies of blocks 2-3.  Both copies stay (vLLM keeps a
    # duplicate as its computer's private block), and a later lookup takes the older one (request 1's).
    sim = _sim([(0.0, 200, 50), (0.0, 200, 50)], [[1, 2, 3], [1, 2, 3]], long_prefill_token_threshold=32)
    seen = []
    sim.core.observer = lambda i, now, out: seen.append([list(r.block_ids) for r in sim.core.scheduler.running])
    sim.run()
    first, second = seen[1]
    assert first[:2] == second[:2] and first[2:4] != second[2:4]
    pool = sim.core.scheduler.pool
    assert pool.num_used == 0
    # Block 2 of hash ids [1, 2, 3] (4 blocks per id) has key 1 * 4 + 2; both copies are cached, oldest first.
    assert pool.copies_of(block_hash(sim.requests[0], 2)) == [second[2], first[2]]
    assert pool.lookup(sim.requests[0], 3)[2] == second[2]
