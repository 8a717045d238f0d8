"""End to end without a GPU: the replay backend launches the twin with a trial's config, replays a slice of the
Azure conversation trace against it, and the request table agrees with the offline simulation of that slice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_test_helpers import GPU, MODEL, replay_lag_s
from objectives import summarize
from replay import ReplayBackend, ReplayOptions
from replay.results import REASON_COLUMN, UNOBSERVED_REQUEST_COLUMNS, UNOBSERVED_STEP_COLUMNS
from sim.engine.core import STEP_COLUMNS
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.tables import REQUEST_COLUMNS

# KV pressure: 600 blocks of 16 tokens for a trace whose prompts average ~1k tokens, so the engine preempts.
KNOBS = {"num_gpu_blocks_override": 600, "max_model_len": 4096}
SPEED = 20.0


@pytest.fixture(scope="module")
def agreement(conv_trace, tmp_path_factory):
    workload = conv_trace.head(150)
    offline = simulate(workload, EngineConfig.from_dict(KNOBS), load_model(MODEL), load_gpu(GPU), seed=0)
    backend = ReplayBackend(workload, model=MODEL, gpu=GPU, engine="twin", speed=SPEED,
                            options=ReplayOptions(sample_interval_wall_s=0.2),
                            out_dir=tmp_path_factory.mktemp("trials"))
    trial = backend.run_trial(KNOBS, [0])
    trial.slack_s = backend.twin_slack_ms / 1000.0 * SPEED  # trace seconds within which arrivals stay exact
    return workload, offline, trial


def test_statuses_identical(agreement):
    _, offline, trial = agreement
    replayed = trial.results[0].requests
    assert list(replayed["request_id"]) == list(offline.requests["request_id"])
    assert list(replayed["status"]) == list(offline.requests["status"])
    assert (replayed["status"] == "finished").sum() >= 140  # the slice has one prompt over max_model_len
    finished = replayed["status"] == "finished"
    assert (replayed.loc[finished, "generated_tokens"].to_numpy()
            == offline.requests.loc[finished, "generated_tokens"].to_numpy()).all()


def test_preemptions_within_5_percent(agreement):
    _, offline, trial = agreement
    sim_total = int(offline.requests["num_preemptions"].sum())
    assert sim_total >= 10, "the config must put the KV cache under pressure"
    replay_total = trial.results[0].preemptions_total
    lag = trial.results[0].info["send_lag_max_s"]
    if lag > trial.slack_s:
        # Arrivals later than the twin's slack reach its engine out of their trace order and batching: which
        # requests get preempted is then a property of this machine's load, not of the engine.  Said, not failed.
        pytest.skip(f"replay send lag {lag:.2f} s (trace) exceeded the twin's slack {trial.slack_s:g} s: the machine "
                    f"was too loaded for an exact-order replay")
    assert abs(replay_total - sim_total) <= 0.05 * sim_total, (replay_total, sim_total, lag)
    assert trial.metrics["preemptions_total"] == replay_total


@pytest.mark.parametrize("q", [0.5, 0.99])
def test_e2e_percentiles_within_10_percent(agreement, q):
    _, offline, trial = agreement
    sim_e2e = offline.requests.loc[offline.requests["status"] == "finished", "e2e_s"].quantile(q)
    rep = trial.results[0].requests
    rep_e2e = rep.loc[rep["status"] == "finished", "e2e_s"].quantile(q)
    # 10% for the model, plus what this machine's load did to the replay (measured, see replay_lag_s): on a quiet machine
    # the bound is the 10%; under CPU contention it widens by exactly what was measured instead of failing.
    lag = replay_lag_s(trial.results[0])
    assert abs(rep_e2e - sim_e2e) <= 0.10 * sim_e2e + lag, (rep_e2e, sim_e2e, lag)


def test_tables_have_the_simulators_columns(agreement):
    _, _, trial = agreement
    result = trial.results[0]
    assert list(result.requests.columns) == [*REQUEST_COLUMNS, REASON_COLUMN]
    for col in UNOBSERVED_REQUEST_COLUMNS:
        assert result.requests[col].isna().all(), col  # not observable by a client: NaN, never invented
    assert list(result.steps.columns) == list(STEP_COLUMNS)
    for col in UNOBSERVED_STEP_COLUMNS:
        assert result.steps[col].isna().all(), col
    steps = result.steps
    # The timeline accounts for every iteration and token the engine counted.
    assert steps["num_steps"].sum() == result.counter_delta("iterations_total") > 0
    assert steps["decode_tokens"].sum() == result.requests["generated_tokens"].sum()
    assert steps["preempted"].sum() == result.preemptions_total
    assert steps["kv_blocks_total"].max() == 600
    assert steps["kv_blocks_used"].max() > 0.5 * 600


def test_objectives_read_both_backends(agreement):
    workload, offline, trial = agreement
    sim_summary = summarize(offline.requests, offline.steps, workload.classes).to_dict()
    rep_summary = trial.metrics
    assert set(sim_summary) <= set(rep_summary)
    lag = replay_lag_s(trial.results[0])  # a lagging replay stretches the makespan and every latency by at most this
    assert rep_summary["output_tokens_per_s"] == pytest.approx(
        sim_summary["output_tokens_per_s"], rel=0.1 + lag / sim_summary["makespan_s"])
    assert rep_summary["all.e2e_s.p50"] == pytest.approx(sim_summary["all.e2e_s.p50"], rel=0.1, abs=lag)
    assert math.isnan(rep_summary["recompute_token_share"])  # recompute is not exported by vLLM
    assert 0 < rep_summary["kv_utilization"] <= 1


def test_results_saved_for_calibration(agreement):
    _, _, trial = agreement
    path = trial.paths[0]
    assert (path / "requests.parquet").is_file() and (path / "replay.json").is_file()
    assert (path.parent / "engine.log").read_text().count("kvtune twin: serving") == 1
    tokens = trial.results[0].token_times
    assert sum(len(v) for v in tokens.values()) == trial.results[0].requests["generated_tokens"].sum()
    assert all(np.all(np.diff(v) >= 0) for v in tokens.values())


def test_token_times_are_in_trace_time(agreement):
    _, _, trial = agreement
    result = trial.results[0]
    req = result.requests.set_index("request_id")
    for rid, times in result.token_times.items():
        if len(times):
            assert times[0] == pytest.approx(req.loc[rid, "first_token_s"], abs=1e-9)
            if req.loc[rid, "status"] == "finished":
                assert times[-1] == pytest.approx(req.loc[rid, "end_s"], abs=1e-9)
