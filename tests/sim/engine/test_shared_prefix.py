"""Shared prefixes (trace ``hash_ids``): blocks another request computed are re-hit, and held once."""

from __future__ import annotations

from sim.engine.config import EngineConfig
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload


def _sim(rows, hashes, **knobs):
    workload = make_workload(rows)
    workload.requests["hash_ids"] = hashes
    config = EngineConfig(max_model_len=1024, enable_prefix_caching=True, **knobs)
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
    pool = sim.core.scheduler.pool
    sim.core.observer = lambda i, now, out: used.append((len(sim.core.scheduler.running), pool.num_used, dict(pool.shared_refs)))
    sim.run()
    both = [(n, u, refs) for n, u, refs in used if n == 2]
    assert both, "the two requests should run together"
    n, u, refs = both[0]
    assert all(count == 2 for count in refs.values()) and len(refs) == 8
    blocks_each = sum(r.kv_blocks_peak for r in sim.requests) // 2
    assert u < 2 * blocks_each, "shared blocks are counted once"
