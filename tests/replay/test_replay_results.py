"""Replay results: the timeline built from /metrics samples, and the result folder written and read back."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from objectives import summarize
from replay.prom import parse_metrics
from replay.results import ReplayResult, timeline_from_samples
from replay_test_helpers import make_workload
from sim.engine.core import STEP_COLUMNS
from sim.tables import REQUEST_COLUMNS
from sim.workload.classes import SLO, RequestClass


def exposition(iterations: int, prompt: int, generation: int, preemptions: int, running: int, usage: float) -> str:
    return f"""# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {iterations}
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {iterations}
vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} 0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {generation}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preemptions}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="1000"}} 1.0
"""


def test_timeline_rows_are_deltas_between_samples():
    snaps = [
        parse_metrics(exposition(0, 0, 0, 0, 0, 0.0), t_s=0.0),
        parse_metrics(exposition(10, 500, 20, 0, 2, 0.25), t_s=1.0),
        parse_metrics(exposition(10, 500, 20, 0, 0, 0.0), t_s=2.0),  # idle second
        parse_metrics(exposition(40, 900, 95, 3, 4, 0.5), t_s=3.5),
    ]
    steps = timeline_from_samples(snaps)
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert steps["num_steps"].tolist() == [10, 0, 30]
    assert steps["start_s"].tolist() == [0.0, 1.0, 2.0]
    assert steps["duration_s"].tolist() == [1.0, 0.0, 1.5]  # an interval without iterations is idle
    assert steps["prefill_tokens_new"].tolist() == [500, 0, 400]
    assert steps["decode_tokens"].tolist() == [20, 0, 75]
    assert steps["preempted"].tolist() == [0, 0, 3]
    assert steps["kv_blocks_used"].tolist() == [250, 0, 500]
    assert (steps["kv_blocks_total"] == 1000).all()
    assert steps[["prefill_tokens_recompute", "swap_out_blocks", "swap_in_blocks", "num_swapped"]].isna().all().all()


def test_kv_usage_falls_back_to_the_v0_name():
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.4\n"
    assert parse_metrics(text).kv_usage() == 0.4
    assert math.isnan(parse_metrics("").kv_usage())


def test_result_folder_round_trip(tmp_path):
    classes = {"chat": RequestClass("chat", slo=SLO(ttft_p99_s=1.0), timeout_s=5.0, cancel_after_s=(1.0, 2.0))}
    workload = make_workload([("chat", 0.0, 100, 10), ("chat", 0.5, 200, 20)], classes)
    requests = pd.DataFrame({c: [np.nan, np.nan] for c in REQUEST_COLUMNS})
    requests["request_id"] = [0, 1]
    requests["class"] = ["chat", "chat"]
    requests["status"] = ["finished", "timed_out"]
    requests["arrival_s"] = [0.0, 0.5]
    requests["prompt_tokens"] = [100, 200]
    requests["output_tokens_target"] = [10, 20]
    requests["generated_tokens"] = [10, 4]
    requests["first_token_s"] = [0.1, 0.9]
    requests["end_s"] = [0.5, 5.5]
    requests["ttft_s"] = requests["first_token_s"] - requests["arrival_s"]
    requests["e2e_s"] = requests["end_s"] - requests["arrival_s"]
    requests["tpot_s"] = [0.4 / 9, 4.6 / 3]
    snaps = [parse_metrics(exposition(0, 0, 0, 0, 0, 0.0), 0.0), parse_metrics(exposition(9, 300, 14, 2, 0, 0.0), 6.0)]
    result = ReplayResult.from_snapshots(requests, snaps, snaps[0], snaps[-1],
                                         {0: np.linspace(0.1, 0.5, 10), 1: np.linspace(0.9, 1.2, 4)},
                                         {"seed": 3, "speed": 1.0}, workload)
    assert result.preemptions_total == 2
    result.save(tmp_path / "run", extra={"engine": {"sim_model": "Llama-3-8B", "gpu": "H100", "config": {}}})
    loaded, meta = ReplayResult.load(tmp_path / "run")
    pd.testing.assert_frame_equal(loaded.requests, result.requests)
    pd.testing.assert_frame_equal(loaded.steps, result.steps)
    assert loaded.workload.classes == classes
    assert loaded.preemptions_total == 2 and loaded.info["seed"] == 3
    assert meta["engine"]["gpu"] == "H100"
    assert np.allclose(loaded.token_times[1], np.linspace(0.9, 1.2, 4))
    summary = summarize(loaded.requests, loaded.steps, loaded.workload.classes).to_dict()
    assert summary["class.chat.count.timed_out"] == 1
    assert math.isnan(summary["preemptions_total"])  # per-request preemptions are not observable
