"""The twin's /metrics is Prometheus text with vLLM's metric names, consistent with what it served."""

from __future__ import annotations

import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

from replay.prom import parse_metrics
from replay_test_helpers import MODEL

NAMES = (
    "vllm:num_preemptions_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_num_preemptions_bucket",
    "vllm:iteration_tokens_total_count",
    "vllm:request_success_total",
    "vllm:cache_config_info",
)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return resp.read().decode()


def test_metrics_parse_with_prometheus_client_and_carry_vllm_names(shared_twin):
    families = list(text_string_to_metric_families(scrape(shared_twin)))
    samples = {s.name: s for f in families for s in f.samples}
    for name in NAMES:
        assert name in samples, name
    kinds = {f.name: f.type for f in families}
    assert kinds["vllm:num_preemptions"] == "counter"
    assert kinds["vllm:kv_cache_usage_perc"] == "gauge"
    assert kinds["vllm:request_num_preemptions"] == "histogram"
    assert samples["vllm:num_requests_running"].labels == {"model_name": MODEL, "engine": "0"}


def test_counters_follow_the_requests(shared_twin):
    before = parse_metrics(scrape(shared_twin))
    client = openai.OpenAI(base_url=shared_twin + "/v1", api_key="unused", max_retries=0)
    for n in (3, 5, 9):
        client.completions.create(model=MODEL, prompt=[7] * 50, max_tokens=n)
    after = parse_metrics(scrape(shared_twin))
    delta = {k: after.summary()[k] - before.summary()[k] for k in ("prompt_tokens_total", "generation_tokens_total")}
    assert delta == {"prompt_tokens_total": 150, "generation_tokens_total": 17}
    assert after.total("vllm:request_success_total", finished_reason="length") - before.total(
        "vllm:request_success_total", finished_reason="length") == 3
    assert after.iterations() - before.iterations() >= 17
    assert after.kv_usage() == 0.0 and after.total("vllm:num_requests_running") == 0
    assert after.num_gpu_blocks() > 0
