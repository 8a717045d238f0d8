"""The shared suite every router in the registry passes (as Optuna tests each sampler against one interface):
no request lost or served twice, one replica reproduces ``simulate`` exactly, results are reproducible; plus round
robin's exact split, the per-replica summaries and the parameter checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.engine.request import FINAL_STATUSES
from sim.errors import ConfigError
from sim.fleet import FleetSimulation, make_router, router_class, router_names, simulate_fleet
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload import bundled_trace_path, load_trace
from tests.sim.engine.conftest import make_workload
from tests.sim.engine.test_invariants import configs, shared_prefix_workloads, workloads

MODEL, GPU = load_model("Llama-3-8B"), load_gpu("H100-SXM")
ROUTERS = router_names()
FINAL = {s.value for s in FINAL_STATUSES}


def _trace(n: int = 300, rate: float = 4.0, hashed: bool = True):
    full = load_trace(bundled_trace_path()).scale_rate(rate)
    requests = full.requests.head(n).reset_index(drop=True)
    if hashed:
        requests = requests.copy()
        requests["hash_ids"] = [[i % 5, 100 + i % 3] + [1000 + 10 * i + j for j in range(2)] for i in range(n)]
    return full.with_requests(requests)


def test_the_registry_holds_the_issue_routers():
    assert set(ROUTERS) >= {"round_robin", "least_outstanding", "least_kv_usage", "sglang_cache_aware",
                            "llm_d_weighted", "dynamo_kv", "session_affinity"}


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_gives_the_single_engine_tables(router):
    """Under the roofline model, with preemptions, client timeouts and prefix caching."""
    workload = _trace(300)
    config = EngineConfig(num_gpu_blocks_override=900, max_num_seqs=64, enable_prefix_caching=True)
    ref = simulate(workload, config, MODEL, GPU, seed=3)
    res = simulate_fleet(workload, config, MODEL, GPU, replicas=1, router=router, seed=3)
    assert (res.requests["replica"] == 0).all()
    pd.testing.assert_frame_equal(res.requests.drop(columns="replica"), ref.requests)
    pd.testing.assert_frame_equal(res.steps.drop(columns="replica"), ref.steps)
    assert res.num_iterations == ref.num_iterations and res.makespan_s == ref.makespan_s
    assert res.replicas["requests"].tolist() == [300] and res.replicas["load_share"].tolist() == [1.0]


def _check_conservation(fleet: FleetSimulation, result, n: int) -> None:
    """Every request ends once, on the replica it was routed to; with an engine aborted (as vLLM aborts on a
    lack of swap space), the rest are unfinished, never lost."""
    table = result.requests
    assert len(table) == n and table["request_id"].is_unique
    assert table["replica"].between(-1, len(fleet.replicas) - 1).all()
    assert (table["generated_tokens"] <= table["output_tokens_target"]).all()
    unfinished = int((table["status"] == "unfinished").sum())
    assert sum(rep.done for rep in fleet.replicas) + unfinished == n
    for rep in fleet.replicas:
        assert rep.assigned == int((table["replica"] == rep.index).sum())
        assert rep.done <= rep.assigned
    if result.aborted is None:
        assert unfinished == 0 and set(table["status"]) <= FINAL and (table["replica"] >= 0).all()
        assert all(rep.done == rep.assigned for rep in fleet.replicas)
    assert result.replicas["requests"].sum() == int((table["replica"] >= 0).sum())


@pytest.mark.parametrize("router", ROUTERS)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(workload=workloads(with_clients=True), config_and_runs=configs(), replicas=st.integers(1, 4))
def test_no_request_lost_or_served_twice(router, workload, config_and_runs, replicas):
    config, batch_runs = config_and_runs
    fleet = FleetSimulation(workload, config, MODEL, GPU, replicas=replicas, router=router,
                            latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs)
    _check_conservation(fleet, fleet.run(), len(workload))


@pytest.mark.parametrize("router", ROUTERS)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(workload=shared_prefix_workloads(with_clients=True), config_and_runs=configs(), replicas=st.integers(2, 3))
def test_no_request_lost_with_shared_prefixes(router, workload, config_and_runs, replicas):
    config, batch_runs = config_and_runs
    fleet = FleetSimulation(workload, config, MODEL, GPU, replicas=replicas, router=router, hash_block_tokens=32,
                            latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs)
    _check_conservation(fleet, fleet.run(), len(workload))


@pytest.mark.parametrize("router", ROUTERS)
def test_same_seed_same_fleet(router):
    workload = _trace(200)
    config = EngineConfig(enable_prefix_caching=True)
    a = simulate_fleet(workload, config, MODEL, GPU, replicas=3, router=router, seed=7)
    b = simulate_fleet(workload, config, MODEL, GPU, replicas=3, router=router, seed=7)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    _ = a.replicas.to_dict()  # summaries are plain data


@pytest.mark.parametrize("router", ["least_kv_usage", "round_robin"])
def test_decode_columns_leave_the_fleet_alone(router):
    """Each replica's running batch kept in decode columns or as requests only: the same tables (the fleet takes
    ``decode_columns`` as ``simulate`` does: ``None`` loads the columns' kernels only where they pay)."""
    workload = make_workload([(0.0005 * i, 150 + 17 * (i % 7), 60 + i % 13) for i in range(240)])
    runs = {}
    for columns in (True, False):
        fleet = FleetSimulation(workload, EngineConfig(), MODEL, GPU, replicas=2, router=router,
                                decode_columns=columns)
        runs[columns] = fleet.run()
        joined = [rep.scheduler._columns is not None and rep.scheduler._columns._k is not None
                  for rep in fleet.replicas]
        assert any(joined) == columns  # the batches here reach the columns' minimum, so they were used
    pd.testing.assert_frame_equal(runs[True].requests, runs[False].requests)
    pd.testing.assert_frame_equal(runs[True].steps, runs[False].steps)


def test_round_robin_splits_exactly():
    workload = _trace(203, hashed=False)
    res = simulate_fleet(workload, EngineConfig(), MODEL, GPU, replicas=4, router="round_robin")
    assert res.requests["replica"].tolist() == [i % 4 for i in range(203)]
    assert res.replicas["requests"].tolist() == [51, 51, 51, 50]
    assert res.fleet["requests"] == 203


def test_summaries_count_prefix_hits_per_replica():
    """Prefix hits over prompt tokens, per replica and fleet-wide, from the request table."""
    workload = _trace(200)
    res = simulate_fleet(workload, EngineConfig(enable_prefix_caching=True), MODEL, GPU, replicas=2,
                         router="round_robin")
    table = res.requests
    for row in res.replicas.itertuples():
        mine = table[table["replica"] == row.replica]
        assert row.requests == len(mine)
        assert row.prefix_hit_tokens == mine["prefix_hit_tokens"].sum()
        assert row.prefix_hit_rate == pytest.approx(mine["prefix_hit_tokens"].sum() / mine["prompt_tokens"].sum())
    assert res.fleet["prefix_hit_rate"] == pytest.approx(table["prefix_hit_tokens"].sum() / table["prompt_tokens"].sum())
    assert res.fleet["prefix_hit_tokens"] > 0
    assert set(res.steps["replica"]) == {0, 1}


def test_a_prefix_router_keeps_more_hits_than_round_robin():
    """64 shared prompts of three 512-token blocks, drawn at random by 400 requests, over four replicas: routing
    by prefix computes each shared prompt about once, round robin about once per replica."""
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 64, 400)
    workload = make_workload([(0.05 * i, 1600, 8) for i in range(400)])
    workload.requests["hash_ids"] = [[1000 * g, 1000 * g + 1, 1000 * g + 2, 10**6 + i] for i, g in enumerate(groups)]
    config = EngineConfig(enable_prefix_caching=True)
    rr = simulate_fleet(workload, config, MODEL, GPU, replicas=4, router="round_robin")
    for router in ("sglang_cache_aware", "dynamo_kv", "llm_d_weighted"):
        res = simulate_fleet(workload, config, MODEL, GPU, replicas=4, router=router)
        assert res.fleet["prefix_hit_rate"] > rr.fleet["prefix_hit_rate"] + 0.1, router


# ---- the registry's checks ---------------------------------------------------------------------------------------
def test_unknown_router_names_the_field():
    with pytest.raises(ConfigError) as err:
        make_router("nope", {}, 2)
    assert err.value.field == "router" and "round_robin" in str(err.value)


@pytest.mark.parametrize("replicas", [0, -1, 1.5, True])
def test_replicas_below_one_is_refused(replicas):
    with pytest.raises(ConfigError) as err:
        make_router("round_robin", {}, replicas)
    assert err.value.field == "replicas"
    with pytest.raises(ConfigError):
        simulate_fleet(_trace(5, hashed=False), EngineConfig(), MODEL, GPU, replicas=replicas)


@pytest.mark.parametrize("router, key, value", [
    ("sglang_cache_aware", "cache_threshold", 1.5),
    ("sglang_cache_aware", "balance_rel_threshold", 0.5),
    ("sglang_cache_aware", "balance_abs_threshold", 2.5),
    ("least_kv_usage", "metrics_lag_s", -1.0),
    ("dynamo_kv", "ttl_s", 0.0),
    ("llm_d_weighted", "prefix_weight", "3"),
    ("round_robin", "anything", 1),
])
def test_a_bad_parameter_names_its_field(router, key, value):
    with pytest.raises(ConfigError) as err:
        make_router(router, {key: value}, 2)
    assert err.value.field == f"router_params.{key}"


@pytest.mark.parametrize("router", ROUTERS)
def test_defaults_are_in_range_and_recorded(router):
    made = make_router(router, {}, 3)
    for key, spec in router_class(router).params.items():
        assert getattr(made, key) == spec.default
    res = simulate_fleet(_trace(20, hashed=False), EngineConfig(), MODEL, GPU, replicas=2, router=router)
    assert res.router == router and set(res.router_params) == set(router_class(router).params)
