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
    # Overlapped with compute: the same steps take the same time as without offload.
    assert offload.steps["duration_s"].sum() == plain.steps["duration_s"].sum()
    assert offload.requests["e2e_s"].tolist() == plain.requests["e2e_s"].tolist()


def test_an_offload_tier_that_is_never_read_is_flagged():
    note = unused_host_tier({"kv_offloading_size_gb": 33.0}, {"swap_in_blocks": 0.0})
    assert note and "33 GiB" in note and "--kv-offloading-size" in note
    assert unused_host_tier({"kv_offloading_size_gb": 33.0}, {"swap_in_blocks": 12.0}) is None
    assert unused_host_tier({}, {"swap_in_blocks": 0.0}) is None
    assert "--swap-space" in unused_host_tier({"preemption_mode": "swap", "swap_space_gb": 4}, {"swap_in_blocks": 0})
