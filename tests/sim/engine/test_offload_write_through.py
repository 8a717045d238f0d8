"""V1 CPU offload as vLLM 0.33's OffloadingConnector stores it: write-through, overlapped with compute."""

from __future__ import annotations

from optimizer._export import unused_host_tier
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload


def _run(offload_gb: float):
    wl = make_workload([(0.01 * i, 200 + 37 * i, 40 + 5 * i) for i in range(12)])
    config = EngineConfig(max_model_len=2048, kv_offloading_size_gb=offload_gb, enable_prefix_caching=False)
    return Simulation(wl, config, load_model("Llama-3-8B"), load_gpu("H100-SXM")).run()


def test_every_request_is_stored_and_the_stores_cost_no_step_time():
    plain, offload = _run(0.0), _run(1.0)
    table = offload.requests.set_index("request_id")
    # No preemption in this light load, yet every request's full blocks reached the CPU tier.
    assert (table["num_preemptions"] == 0).all()
    assert (table["swapped_out_blocks"] == (table["prompt_tokens"] + table["output_tokens_target"] - 1) // 16).all()
    assert offload.steps["swap_out_blocks"].sum() == table["swapped_out_blocks"].sum()
    # Overlapped with compute: the same steps, cut into the same decode runs (a run stores once per step, as single
    # steps do), take the same time as without offload.
    assert offload.steps["num_steps"].tolist() == plain.steps["num_steps"].tolist()
    assert offload.steps["duration_s"].sum() == plain.steps["duration_s"].sum()
    assert offload.requests["e2e_s"].tolist() == plain.requests["e2e_s"].tolist()


def test_an_offload_tier_that_is_never_read_is_flagged():
    note = unused_host_tier({"kv_offloading_size_gb": 33.0}, {"swap_in_blocks": 0.0})
    assert note and "33 GiB" in note and "--kv-offloading-size" in note
    assert unused_host_tier({"kv_offloading_size_gb": 33.0}, {"swap_in_blocks": 12.0}) is None
    assert unused_host_tier({}, {"swap_in_blocks": 0.0}) is None
    assert "--swap-space" in unused_host_tier({"preemption_mode": "swap", "swap_space_gb": 4}, {"swap_in_blocks": 0})


def test_loads_are_asynchronous_and_the_request_resumes_after_its_load_lands():
    # A cache too small for both requests: the second is preempted, its blocks are on the CPU (write-through),
    # and it resumes by loading them back instead of recomputing.
    wl = make_workload([(0.0, 300, 200), (0.0, 300, 200)])
    config = EngineConfig(max_model_len=600, num_gpu_blocks_override=40, kv_offloading_size_gb=1.0,
                          enable_prefix_caching=False, async_scheduling=False)
    sim = Simulation(wl, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"))
    scheduler = sim.core.scheduler
    starts: dict[int, tuple[float, float]] = {}
    scheduled_at: dict[int, list[float]] = {}

    def observe(i, now, out):
        assert out.shape.swap_blocks == 0  # neither stores nor loads are on a step's path
        for ready, req in scheduler.loading:
            starts.setdefault(req.request_id, (now, ready))
        for req, _ in out.scheduled:
            scheduled_at.setdefault(req.request_id, []).append(now)

    sim.core.observer = observe
    sim.core.batch_decode_runs = False
    result = sim.run()
    table = result.requests.set_index("request_id")
    assert (table["status"] == "finished").all()
    assert starts, "the preempted request should have loaded its blocks back"
    for rid, (start, ready) in starts.items():
        assert ready > start
        assert table.loc[rid, "swapped_in_blocks"] > 0
        waiting = [t for t in scheduled_at[rid] if start <= t < ready]
        assert not waiting, "scheduled while its load was in flight"
        assert any(t >= ready for t in scheduled_at[rid])
    # What was loaded was not recomputed.
    assert table["recomputed_tokens"].sum() < table["num_preemptions"].sum() * 300


def test_a_run_cut_short_counts_the_copies_of_requests_still_live():
    # The CPU tier counts each request's copies and they reach its row when it ends, or when the run does for
    # requests still in the system (BaseScheduler.settle): the per-request counts add up to the steps' copies.
    wl = make_workload([(0.01 * i, 200 + 37 * i, 400 + 5 * i) for i in range(12)])
    config = EngineConfig(max_model_len=2048, kv_offloading_size_gb=1.0, enable_prefix_caching=False)
    result = Simulation(wl, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"), max_sim_time_s=0.5).run()
    table = result.requests
    live = table[table["status"] == "unfinished"]
    assert len(live) and (live["swapped_out_blocks"] > 0).all()
    assert result.steps["swap_out_blocks"].sum() == table["swapped_out_blocks"].sum() > 0
