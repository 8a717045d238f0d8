"""Simulator invariants as properties over random small workloads and configs, for both flavors.

Checked at every step through the engine's observer: blocks are conserved (used + cached + empty = total,
none negative, used = blocks held by running requests); ``max_num_seqs`` and the token budget are never
exceeded; the clock never goes back.  Checked at the end: every request ends in exactly one final status;
a finished request processed prompt + generated - 1 + recomputed tokens (the last sampled token is never
fed back); the step table's token columns add up to what the requests processed.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.engine.request import FINAL_STATUSES, Status
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from sim.workload.classes import RequestClass
from tests.sim.engine.conftest import make_workload

MAX_MODEL_LEN = 256


@st.composite
def workloads(draw, with_clients: bool):
    n = draw(st.integers(1, 25))
    rows, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.003, 0.02, 0.1]))
        prompt = draw(st.integers(1, 200))
        output = draw(st.integers(1, 60))
        rows.append((t, prompt, output, draw(st.sampled_from(["a", "b"]))))
    if with_clients:
        classes = {
            "a": RequestClass("a", timeout_s=draw(st.sampled_from([None, 0.05, 0.3])), priority=0),
            "b": RequestClass("b", cancel_probability=draw(st.sampled_from([0.0, 0.5])), cancel_after_s=(0.0, 0.2), priority=1),
        }
    else:
        classes = {"a": RequestClass("a"), "b": RequestClass("b", priority=1)}
    return make_workload(rows, classes)


@st.composite
def configs(draw):
    flavor = draw(st.sampled_from(["vllm-v1", "vllm-v0"]))
    block_size = draw(st.sampled_from([8, 16]))
    min_blocks = MAX_MODEL_LEN // block_size + 1
    knobs = dict(
        flavor=flavor,
        block_size=block_size,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=draw(st.integers(min_blocks, min_blocks * 4)),
        max_num_seqs=draw(st.integers(1, 12)),
        reserved_kv_fraction=draw(st.sampled_from([0.0, 0.1, 0.3])),
        admission_policy=draw(st.sampled_from(["greedy", "predicted"])),
        admission_headroom=draw(st.sampled_from([0.0, 0.05])),
    )
    if flavor == "vllm-v1":
        knobs.update(
            max_num_batched_tokens=draw(st.sampled_from([16, 48, 256])),
            watermark=draw(st.sampled_from([0.0, 0.05])),
            scheduler_reserve_full_isl=draw(st.booleans()),
            enable_prefix_caching=draw(st.booleans()),
            scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
            long_prefill_token_threshold=draw(st.sampled_from([0, 24])),
            kv_offloading_size_gb=draw(st.sampled_from([0.0, 0.05])),
            async_scheduling=draw(st.booleans()),
        )
    else:
        chunked = draw(st.booleans())
        knobs.update(
            enable_chunked_prefill=chunked,
            max_num_batched_tokens=draw(st.sampled_from([16, 48, 256] if chunked else [256, 512])),
            preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
            swap_space_gb=draw(st.sampled_from([0.01, 1.0])),
        )
        knobs["max_num_seqs"] = min(knobs["max_num_seqs"], knobs["max_num_batched_tokens"])
    return EngineConfig(**knobs), draw(st.booleans())


def _run_checked(workload, config, batch_runs, hash_block_tokens=512):
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs,
                     hash_block_tokens=hash_block_tokens)
    scheduler = sim.core.scheduler
    pool = scheduler.pool
    resolved = sim.config
    last_now = [-1.0]

    def observe(iteration, now, out):
        assert now >= last_now[0], "the clock went back"
        last_now[0] = now
        assert pool.num_used >= 0 and pool.num_empty >= 0 and pool.num_cached >= 0
        assert pool.num_used + pool.num_cached + pool.num_empty == pool.num_blocks
        # Requests loading their offloaded blocks back (async, Status.LOADING) hold blocks too, and keep them in
        # the waiting queue once the load has landed until they are admitted.
        holding = (list(scheduler.running) + [r for _, r in scheduler.loading]
                   + [r for r in scheduler.waiting if r.blocks])
        if scheduler.blocks_hashed:
            # A hashed block is used once however many requests hold it; its reference count is the number of
            # holders, and a block nobody holds is in the free queue.
            holders: dict[int, int] = {}
            for r in holding:
                assert len(r.block_ids) <= r.blocks
                for bid in r.block_ids:
                    holders[bid] = holders.get(bid, 0) + 1
            assert pool.num_used == sum(r.blocks - len(r.block_ids) for r in holding) + len(holders)
            refs = {bid: n for bid, (_, n, _) in pool.blocks().items()}
            # (An own block not in the pool's map yet, id < 0, has one holder: the request that hashed it.)
            refs.update((bid, 1) for r in holding for bid, _, _ in pool.unmapped(r))
            assert holders == {bid: n for bid, n in refs.items() if n}
            assert sorted(pool.free_queue()) == sorted(bid for bid, n in refs.items() if n == 0)
        else:
            assert pool.num_used == sum(r.blocks for r in holding)
        assert len(scheduler.running) <= resolved.max_num_seqs
        # Async scheduling frees a finished request's blocks right after the next schedule(): none is left then.
        assert not scheduler.deferred_free
        assert sum(n for _, n in out.scheduled) <= resolved.max_num_batched_tokens
        assert len({id(r) for r, _ in out.scheduled}) == len(out.scheduled), "a request scheduled twice in a step"

    sim.core.observer = observe
    return sim, sim.run()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_invariants_hold_with_timeouts_and_cancels(workload, config_and_runs):
    config, batch_runs = config_and_runs
    sim, result = _run_checked(workload, config, batch_runs)
    table = result.requests
    assert len(table) == len(workload)
    assert table["request_id"].is_unique
    assert set(table["status"]) <= {s.value for s in FINAL_STATUSES}
    if config.flavor == "vllm-v1" or config.preemption_mode != "swap":
        assert result.aborted is None, "only V0 swap preemption can abort the engine"
    if result.aborted is None:
        assert not (table["status"] == Status.UNFINISHED.value).any()
    ended = table[table["status"] != Status.UNFINISHED.value]
    assert (ended["end_s"] >= ended["arrival_s"]).all()
    starts = result.steps["start_s"].to_numpy()
    assert (starts[1:] >= starts[:-1]).all()
    # Nothing is held once every request has ended.
    if result.aborted is None:
        assert sim.core.scheduler.pool.num_used == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=False), config_and_runs=configs())
def test_token_accounting(workload, config_and_runs):
    config, batch_runs = config_and_runs
    sim, result = _run_checked(workload, config, batch_runs)
    if result.aborted is not None:
        return  # V0 swap space exhausted: the engine died (tested on its own)
    for req in sim.requests:
        if req.status == Status.FINISHED:
            assert req.processed_tokens == req.prompt_tokens + req.num_output_tokens - 1 + req.recomputed_tokens
            assert req.num_output_tokens == req.max_output
    steps = result.steps
    stepped = int((steps["prefill_tokens_new"] + steps["prefill_tokens_recompute"] + steps["decode_tokens"]).sum())
    assert stepped == sum(r.processed_tokens for r in sim.requests)
    assert int(steps["prefill_tokens_recompute"].sum()) == int(result.requests["recomputed_tokens"].sum())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_batched_decode_runs_match_single_steps(workload, config_and_runs):
    """Batching identical decode steps is an optimisation: it must not change any request's outcome."""
    config, _ = config_and_runs
    _, batched = _run_checked(workload, config, True)
    _, single = _run_checked(workload, config, False)
    # (swapped_out_blocks: a run stores to a CPU offload tier once per step, as single steps do.)
    cols = ["status", "generated_tokens", "num_preemptions", "recomputed_tokens", "swapped_out_blocks"]
    assert batched.requests[cols].equals(single.requests[cols])
    # Closed-form sums of a run and step-by-step sums differ only by float rounding.
    assert np.allclose(batched.requests["end_s"].fillna(-1), single.requests["end_s"].fillna(-1), rtol=0, atol=1e-9)


@st.composite
def shared_prefix_workloads(draw, with_clients: bool = False):
    """Requests whose prompts start with one of three shared prefixes (hash ids of 32-token blocks)."""
    n = draw(st.integers(2, 20))
    rows, t, hashes = [], 0.0, []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.003, 0.02, 0.1]))
        group = draw(st.integers(0, 2))
        num_ids = draw(st.integers(0, 4))
        prompt = draw(st.integers(1, 200))
        rows.append((t, prompt, draw(st.integers(1, 40)), "a"))
        hashes.append([group * 100 + j for j in range(num_ids)])
    timeout = draw(st.sampled_from([None, 0.05, 0.3])) if with_clients else None
    workload = make_workload(rows, {"a": RequestClass("a", timeout_s=timeout)})
    workload.requests["hash_ids"] = hashes
    return workload


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=shared_prefix_workloads(), config_and_runs=configs())
def test_shared_prefix_blocks(workload, config_and_runs):
    """With shared prefixes: conservation and reference counts hold at every step (observer), nothing is left
    referenced at the end, and a finished request processed no more than prompt + generated - 1 + recomputed
    tokens and no fewer than that minus what it found in the cache."""
    config, batch_runs = config_and_runs
    sim, result = _run_checked(workload, config, batch_runs, hash_block_tokens=32)
    if result.aborted is not None:
        return
    pool = sim.core.scheduler.pool
    assert pool.num_used == 0
    if sim.core.scheduler.blocks_hashed:
        assert not any(ref for _, ref, _ in pool.blocks().values()), "a block is still referenced"
    for req in sim.requests:
        if req.status == Status.FINISHED:
            full = req.prompt_tokens + req.num_output_tokens - 1 + req.recomputed_tokens
            assert full - req.prefix_hit_tokens - req.preempted_hit_tokens <= req.processed_tokens <= full
    steps = result.steps
    stepped = int((steps["prefill_tokens_new"] + steps["prefill_tokens_recompute"] + steps["decode_tokens"]).sum())
    assert stepped == sum(r.processed_tokens for r in sim.requests)



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=shared_prefix_workloads(with_clients=True), config_and_runs=configs())
def test_batched_decode_runs_match_single_steps_with_shared_prefixes(workload, config_and_runs):
    """With shared prefixes too, batching decode steps changes no request's preemptions, hits, first token or
    finish (block hashing along a run, then eviction at its end, give the step-by-step cache state)."""
    config, _ = config_and_runs
    _, batched = _run_checked(workload, config, True, hash_block_tokens=32)
    _, single = _run_checked(workload, config, False, hash_block_tokens=32)
    cols = ["status", "generated_tokens", "num_preemptions", "recomputed_tokens", "prefix_hit_tokens",
            "preempted_hit_tokens", "swapped_out_blocks"]
    assert batched.requests[cols].equals(single.requests[cols])
    for col in ("first_token_s", "end_s"):
        assert np.allclose(batched.requests[col].fillna(-1), single.requests[col].fillna(-1), rtol=0, atol=1e-9)
