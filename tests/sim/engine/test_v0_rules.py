"""Hand-worked cases of vLLM V0's scheduling rules (vllm/core/scheduler.py, block_manager.py, 0.8.5.post1)."""

from __future__ import annotations

import pytest

from sim.engine.request import Status
from tests.sim.engine.conftest import make_sim, make_workload

V0 = dict(flavor="vllm-v0", max_num_seqs=16)


def _run_logged(sim):
    log = []

    def observe(iteration, now, out):
        log.append({
            "now": now,
            "scheduled": [(r.request_id, n) for r, n in out.scheduled],
            "preempted": [r.request_id for r in out.preempted],
            "swap_in": out.swap_in_blocks,
            "admitted": out.num_admitted,
            "num_swapped": sim.core.scheduler.num_swapped(),
        })

    sim.core.observer = observe
    sim.core.batch_decode_runs = False
    return sim.run(), log


def test_watermark_rejects_a_prompt_that_can_never_fit():
    # 100 blocks: watermark int(0.01 * 100) = 1. A prompt of 100 blocks leaves 0 < 1: AllocStatus.NEVER,
    # although the prompt is shorter than max_model_len (1600) and the cache holds 1600 tokens.
    wl = make_workload([(0.0, 1599, 4), (0.0, 100, 4)])
    sim = make_sim(wl, num_gpu_blocks_override=100, max_model_len=1600, max_num_batched_tokens=2048, **V0)
    table = sim.run().requests.set_index("request_id")
    assert table.loc[0, "status"] == Status.REJECTED.value
    assert table.loc[1, "status"] == Status.FINISHED.value


def test_swap_abort_when_cpu_blocks_run_out():
    # Swap preemption with almost no CPU swap space: vLLM raises "Aborted due to the lack of CPU swap space".
    wl = make_workload([(0.0, 40, 60), (0.0, 40, 60)])
    sim = make_sim(wl, num_gpu_blocks_override=8, max_model_len=128, max_num_batched_tokens=128,
                   preemption_mode="swap", swap_space_gb=0.001, **V0)
    result = sim.run()
    assert result.aborted is not None and "swap space" in result.aborted
    assert (result.requests["status"] == Status.UNFINISHED.value).any()


def test_swap_preemption_then_swap_in_without_recompute():
    wl = make_workload([(0.0, 40, 60), (0.0, 40, 60)])
    sim = make_sim(wl, num_gpu_blocks_override=8, max_model_len=128, max_num_batched_tokens=128,
                   preemption_mode="swap", swap_space_gb=1.0, **V0)
    result, log = _run_logged(sim)
    assert result.aborted is None
    table = result.requests
    assert table["num_preemptions"].sum() >= 1
    assert table["recomputed_tokens"].sum() == 0, "swap keeps the KV: nothing is recomputed"
    assert table["swapped_in_blocks"].sum() == table["swapped_out_blocks"].sum() > 0
    for entry in log:
        if entry["swap_in"]:
            assert not entry["preempted"], "swap-in only in steps that preempted nothing"


def test_default_path_prefill_steps_carry_no_decodes_and_wait_for_swapped():
    wl = make_workload([(0.0, 40, 60), (0.0, 40, 60), (0.2, 20, 5), (0.3, 20, 5)])
    sim = make_sim(wl, num_gpu_blocks_override=9, max_model_len=128, max_num_batched_tokens=128,
                   preemption_mode="swap", swap_space_gb=1.0, **V0)
    result, log = _run_logged(sim)
    assert result.aborted is None
    for entry in log:
        if entry["admitted"]:
            assert len(entry["scheduled"]) == entry["admitted"], "a prefill step carries no decodes"
            assert entry["num_swapped"] == 0, "no prefill while something is swapped out"


def test_recompute_preemption_goes_to_front_of_waiting():
    wl = make_workload([(0.0, 40, 60), (0.0, 40, 60), (0.01, 20, 2)])
    sim = make_sim(wl, num_gpu_blocks_override=8, max_model_len=128, max_num_batched_tokens=128, **V0)
    result, log = _run_logged(sim)
    table = result.requests.set_index("request_id")
    assert table.loc[1, "num_preemptions"] >= 1
    # After request 1 is preempted, the late short request 2 does not jump ahead of it.
    first_preempt = next(e["now"] for e in log if e["preempted"])
    resumed_1 = next(e["now"] for e in log if e["now"] > first_preempt and any(rid == 1 for rid, _ in e["scheduled"]))
    started_2 = table.loc[2, "first_scheduled_s"]
    assert started_2 >= resumed_1 or started_2 < first_preempt


def test_chunked_v0_mixes_decodes_and_prefills():
    wl = make_workload([(0.0, 30, 20), (0.05, 100, 3)])
    sim = make_sim(wl, max_model_len=256, max_num_batched_tokens=32, enable_chunked_prefill=True, **V0)
    result, log = _run_logged(sim)
    mixed = [e for e in log if len(e["scheduled"]) == 2 and {n for _, n in e["scheduled"]} != {1}]
    assert mixed, "with chunked prefill a decode and a prefill chunk share a step"
    assert all(sum(n for _, n in e["scheduled"]) <= 32 for e in log)
    assert (result.requests["status"] == "finished").all()


def test_v0_without_chunking_needs_budget_for_max_len():
    from sim.errors import ConfigError

    wl = make_workload([(0.0, 10, 2)])
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        make_sim(wl, max_model_len=4096, max_num_batched_tokens=1024, **V0)
