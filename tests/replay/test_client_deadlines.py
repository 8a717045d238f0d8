"""Client timeouts and cancellations: the load generator closes the stream at the class's deadline, records
``timed_out`` / ``cancelled``, and the twin aborts the request and frees its KV blocks (visible in /metrics)."""

from __future__ import annotations

import math

import pytest

from replay import ReplayOptions, replay
from replay_test_helpers import GPU, MODEL, make_workload, replay_lag_s, running_twin
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload.classes import RequestClass

# Real time: the token comparison below is off by (wall-clock lag) x SPEED x ~60 tokens/s, so a faster replay turns
# the same few ms of CPU contention into more tokens (at 5x, 11 ms of it gave 7 tokens and failed CI). At 1x, 13
# streams make ~650 chunks/s, and the replay takes 1.4 s.
SPEED = 1.0
KNOBS = {"max_model_len": 4096, "num_gpu_blocks_override": 2000}
TIMEOUT_S = 1.0
CLASSES = {
    # Long answers (~1000 tokens, ~18 s each) behind a 1 s client timeout: every one of them times out.
    "impatient": RequestClass("impatient", timeout_s=TIMEOUT_S),
    "normal": RequestClass("normal"),
    # Every client of this class cancels between 0.6 and 0.8 s after sending.
    "flaky": RequestClass("flaky", cancel_probability=1.0, cancel_after_s=(0.6, 0.8)),
}
ROWS = (
    [("impatient", 0.05 * i, 1000, 1000) for i in range(6)]
    + [("normal", 0.1 + 0.1 * i, 300, 20) for i in range(4)]
    + [("flaky", 0.2 + 0.1 * i, 500, 800) for i in range(3)]
)


@pytest.fixture(scope="module")
def deadline_run(tmp_path_factory):
    workload = make_workload(ROWS, CLASSES)
    offline = simulate(workload, EngineConfig.from_dict(KNOBS), load_model(MODEL), load_gpu(GPU), seed=0)
    with running_twin(KNOBS, speed=SPEED, tmp_path=tmp_path_factory.mktemp("twin")) as url:
        result = replay(url, workload, ReplayOptions(speed=SPEED, seed=0, sample_interval_wall_s=0.05))
    return workload, offline, result


def test_statuses_match_the_simulation(deadline_run):
    _, offline, result = deadline_run
    rep = result.requests.set_index("request_id")
    sim = offline.requests.set_index("request_id")
    assert list(rep["status"]) == list(sim["status"])
    by_class = rep.groupby("class")["status"].agg(lambda s: sorted(set(s)))
    assert by_class.to_dict() == {"impatient": ["timed_out"], "normal": ["finished"], "flaky": ["cancelled"]}


def test_aborted_rows_end_at_their_deadline(deadline_run):
    workload, offline, result = deadline_run
    rep = result.requests
    timed_out = rep[rep["status"] == "timed_out"]
    assert (timed_out["e2e_s"] - TIMEOUT_S).abs().max() < 1e-6  # censored at the timeout, never dropped
    assert (timed_out["generated_tokens"] > 0).all() and (timed_out["generated_tokens"] < 1000).all()
    sim = offline.requests.set_index("request_id").loc[timed_out["request_id"]]
    # The client counts tokens received before the deadline; the simulator those of steps ending by its abort.
    # 2 tokens on a quiet machine, plus the tokens a request makes in the time this machine's load delayed the
    # replay (measured by the replay itself, see replay_lag_s; its largest send lag: this bounds every request).
    lag = replay_lag_s(result, worst=True)
    rate = sim["generated_tokens"].max() / TIMEOUT_S  # tokens per second of a request before its deadline
    bound = 2 + math.ceil(lag * rate)
    diff = (timed_out["generated_tokens"].to_numpy() - sim["generated_tokens"].to_numpy()).__abs__().max()
    assert diff <= bound, (diff, bound, lag)
    cancelled = rep[rep["status"] == "cancelled"]
    assert cancelled["e2e_s"].between(0.6 - 1e-6, 0.8 + 1e-6).all()
    assert list(cancelled["end_s"].round(9)) == list(
        offline.requests.set_index("request_id").loc[cancelled["request_id"], "end_s"].round(9))


def test_twin_frees_the_blocks_of_aborted_requests(deadline_run):
    _, _, result = deadline_run
    # The replay ended right after the last deadline (~1.4 s); the long requests would have run ~18 s more.
    assert result.requests["end_s"].max() < 2.0
    after = result.metrics_after
    assert after["kv_cache_usage_perc"] == 0.0
    assert after["num_requests_running"] == 0 and after["num_requests_waiting"] == 0
    steps = result.steps
    # While the long requests ran they held their prompts' blocks at least; the last sample holds none.
    assert steps["kv_blocks_used"].max() > 6 * 1000 / 16
    assert steps["kv_blocks_used"].iloc[-1] == 0
    # The twin counted the abort of each timed-out or cancelled request.
    aborted = result.requests["status"].isin(["timed_out", "cancelled"]).sum()
    assert result.counter_delta("requests_aborted_total") == aborted == 9
    assert result.info["request_num_preemptions_hist"]["+Inf"] == len(result.requests)
    # ... and stopped generating for it: a few tokens past the client's deadline (the disconnect reaches the
    # engine at its next step boundary), not the ~1000 tokens each of them asked for.
    received = result.requests["generated_tokens"].sum()
    assert received <= result.counter_delta("generation_tokens_total") <= received + 10 * aborted
