"""router_check.py's offline parts: the speed fitted on the round-robin run (issue 31's real-router check)."""

from __future__ import annotations

import argparse

import pytest
import yaml
from real_engine_helpers import load_benchmark


@pytest.fixture(scope="module")
def rc():
    return load_benchmark("router_check.py", "real_engine_router_check")


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_fit_speed_recovers_the_step_time_factor_of_a_round_robin_run(rc, tmp_path, scale):
    # A "measured" round-robin run that is kvtune's own fleet with every step time x scale: the fit finds scale
    # again from the run's median time in flight (send to end), the load a router counts.
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"coefficients": {"mfu": 0.05, "bw_eff": 0.2}}))
    args = argparse.Namespace(profile=profile, model="Llama-2-7B", blocks=300, max_num_seqs=32)
    workload = rc.shared_prefix_workload(80, 4, 4, 2.0, 3)
    req = rc._simulate_fleet(args, "round_robin", workload, scale).requests
    real = {"sent_s": req["arrival_s"].tolist(), "end_s": (req["arrival_s"] + req["e2e_s"]).tolist()}
    assert rc.fit_speed(args, real, workload) == pytest.approx(scale, rel=0.02)
    # --fit-each: a run of another router is fitted on that router's simulation
    ca = rc._simulate_fleet(args, "least_outstanding", workload, scale).requests
    own = {"sent_s": ca["arrival_s"].tolist(), "end_s": (ca["arrival_s"] + ca["e2e_s"]).tolist()}
    assert rc.fit_speed(args, own, workload, "least_outstanding") == pytest.approx(scale, rel=0.02)
    assert rc.simulate(args, "sglang_cache_aware", workload, scale)["step_scale"] == scale
    # a run slower than the search range allows is refused, not clipped
    far = {"sent_s": real["sent_s"], "end_s": [s + 1e6 for s in real["sent_s"]]}
    with pytest.raises(SystemExit, match="outside what step times"):
        rc.fit_speed(args, far, workload)


def test_kvtune_routed_runs_are_simulated_with_the_router_that_ran(rc):
    assert rc.router_of("cache_aware") == "sglang_cache_aware"
    assert rc.router_of("round_robin") == "round_robin"
    assert rc.router_of("kvtune:llm_d_weighted") == "llm_d_weighted"
    with pytest.raises(KeyError):
        rc.router_of("power_of_two")  # a sglang-router policy kvtune has no model of


@pytest.mark.parametrize("argv, message", [
    (["--kvtune-routers", "round_robin,fastest"], "unknown router 'fastest'"),
    (["--skip-sglang"], "--skip-sglang needs --kvtune-routers"),
    (["--router-seeds", "0"], "--router-seeds must be >= 1"),
    (["--fit-each"], "--fit-each needs --fit-speed"),
])
def test_bad_router_flags_exit_2_with_one_line(rc, tmp_path, capsys, argv, message):
    assert rc.main([*argv, "--out", str(tmp_path / "out"), "--sim-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_run_is_measured_per_engine_from_its_metrics_deltas(rc):
    import pandas as pd

    table = pd.DataFrame({"replica": [0, 1, 1, 0, 1], "ttft_s": [0.1, 0.2, float("nan"), 0.4, 0.5]})
    before = [{"prefix_cache_queries_total": 100, "prefix_cache_hits_total": 10}] * 2
    after = [{"prefix_cache_queries_total": 300, "prefix_cache_hits_total": 60},
             {"prefix_cache_queries_total": 100, "prefix_cache_hits_total": 10}]
    run = rc.measured_run("kvtune:x", table, before, after, [0.0, 1.0, 2.0, 3.0, 4.0],
                          [0.5, 1.5, float("nan"), 3.5, 4.5], 1, "unfinished")
    assert [p["requests"] for p in run["replicas"]] == [2, 3]
    assert [p["hit_rate"] for p in run["replicas"]] == [0.25, 0.0]  # 50 of 200; no queries on e1
    assert run["fleet_hit_rate"] == 0.25 and run["end_s"][2] is None and run["replica_of"] == [0, 1, 1, 0, 1]
    assert run["ttft_p50_s"] == pytest.approx(0.3) and (run["errors"], run["first_error"]) == (1, "unfinished")


def test_the_seed_spread_relabels_each_seed_and_counts_those_within_10_percent(rc):
    """Per replica over the seeds: median, least and most of the simulated requests and hit rates, each seed's
    replicas relabelled as ``compare`` does (a seed that swaps the two identical replicas is read swapped)."""
    real = {"replica_of": [0, 0, 1, 1], "replicas": [{"requests": 100, "hit_rate": 0.5},
                                                     {"requests": 200, "hit_rate": 0.4}], "fleet_hit_rate": 0.45}

    def sim(counts, hits, replica_of):
        return {"replica_of": replica_of, "fleet_hit_rate": 0.45,
                "replicas": [{"requests": c, "hit_rate": h} for c, h in zip(counts, hits)]}

    sims = [sim((105, 195), (0.52, 0.30), [0, 0, 1, 1]),   # e0 within, e1 count within, e1 hit rate not
            sim((230, 70), (0.41, 0.70), [1, 1, 0, 0]),    # swapped: e0 = 70 (-30%), e1 = 230 (+15%)
            sim((100, 200), (0.50, 0.40), [0, 0, 1, 1])]   # exact
    spread = rc.seed_spread(real, sims)
    assert spread["seeds"] == 3
    e0, e1 = spread["per"]
    assert e0["requests"] == (100.0, 70, 105) and e1["requests"] == (200.0, 195, 230)
    assert e0["count_within"] == 2 and e1["count_within"] == 2
    assert e0["hit_rate"] == (0.52, 0.5, 0.7) and e1["hit_rate"] == (0.4, 0.3, 0.41)
    assert e0["hit_within"] == 2 and e1["hit_within"] == 2


def test_as_sent_moves_each_arrival_to_its_measured_send_and_keeps_the_order(rc):
    workload = rc.shared_prefix_workload(6, 2, 2, 2.0, 3)
    trace = workload.requests["arrival_s"].tolist()
    # a lagging client (+0.1 s on request 2), a send recorded a microsecond early (4), one never sent (5)
    sent = [trace[0], trace[1], trace[2] + 0.1, trace[3] + 0.01, None, None]
    sent[4] = trace[3] + 0.01 - 1e-6
    moved = rc.as_sent(workload, {"sent_s": sent}).requests["arrival_s"].tolist()
    assert moved[:4] == [trace[0], trace[1], trace[2] + 0.1, max(trace[3] + 0.01, trace[2] + 0.1)]
    assert moved[4] == moved[3]  # the running maximum: never before the request sent ahead of it
    assert moved[5] == max(trace[5], moved[4])  # not sent: its trace time
    assert workload.requests["arrival_s"].tolist() == trace  # the workload itself is not changed


def test_rule_check_runs_where_the_recorded_spans_are_all_a_router_saw(rc):
    # sglang-router's cache_aware run, and kvtune's routers that read only their own in-flight counts
    assert rc.rule_checked("sglang_cache_aware", sglang=True)
    assert rc.rule_checked("sglang_cache_aware", sglang=False) and rc.rule_checked("least_outstanding", sglang=False)
    # no loads read (round robin, session affinity), engine metrics (llm-d, KV usage), first-token hooks (Dynamo)
    for router in ("round_robin", "session_affinity", "llm_d_weighted", "least_kv_usage", "dynamo_kv"):
        assert not rc.rule_checked(router, sglang=False), router


def test_the_rule_check_gives_back_a_load_following_routers_decisions_from_its_spans(rc):
    # kvtune's least_outstanding placed a trace from the spans it counted (send to release): fed the loads those
    # spans give, the rule check must agree with every decision; with the spans cut short it must not.
    from sim.fleet import ReplicaView, RequestView, make_router
    from sim.runner import RequestStore
    from sim.engine.config import EngineConfig

    workload = rc.shared_prefix_workload(40, 4, 2, 20.0, 3)
    df = workload.requests
    keys = RequestStore(workload, EngineConfig(block_size=rc.BLOCK, enable_prefix_caching=True), 0, rc.BLOCK, None,
                        False).keys
    sent = df["arrival_s"].to_numpy()
    end = sent + 0.3
    model, placed = make_router("least_outstanding", {}, 2), []
    for i in range(len(df)):
        loads = [sum(1 for j in range(i) if placed[j] == r and end[j] > sent[i]) for r in range(2)]
        view = RequestView(index=i, arrival_s=float(sent[i]), class_name="chat",
                           prompt_tokens=int(df["prompt_tokens"].iloc[i]), block_hashes=keys[i], block_size=rc.BLOCK)
        placed.append(model.route(view, [ReplicaView(index=r, routed=0, outstanding=loads[r]) for r in range(2)]))
    real = {"sent_s": sent.tolist(), "end_s": end.tolist(), "replica_of": placed}
    assert rc.rule_check(real, "least_outstanding", workload)["agree"] == len(df)
    short = {**real, "end_s": (sent + 1e-3).tolist()}
    assert rc.rule_check(short, "least_outstanding", workload)["agree"] < len(df)
    # the router placing the trace itself from those spans gives back the run's counts; with every span the same,
    # the median span changes nothing and every random draw of the spans is that span again
    spans = rc.span_check(real, "least_outstanding", workload, draws=5)
    counts = [placed.count(r) for r in range(2)]
    assert spans["exact"] == counts and spans["median"] == counts and spans["drawn_e1"] == (counts[1],) * 3
    assert spans["median_span_s"] == pytest.approx(0.3)
    # cache_aware takes the first of equal loads (replica 0) for a session's first request: with spans too short
    # for any request to be in flight at another's arrival, every session starts there; with 0.3 s, not
    assert rc.span_check(short, "sglang_cache_aware", workload, draws=3)["exact"] == [len(df), 0]
    assert rc.span_check(real, "sglang_cache_aware", workload, draws=3)["exact"] != [len(df), 0]


def test_the_client_offset_is_what_the_measured_ttft_holds_beyond_the_simulated(rc, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"coefficients": {"mfu": 0.05, "bw_eff": 0.2}}))
    args = argparse.Namespace(profile=profile, model="Llama-2-7B", blocks=300, max_num_seqs=32)
    workload = rc.shared_prefix_workload(40, 4, 4, 2.0, 3)
    plain = rc.simulate(args, "round_robin", workload)
    later = rc.simulate(args, "round_robin", workload, client_offset_s=0.04)
    assert later["ttft_p50_s"] == pytest.approx(plain["ttft_p50_s"] + 0.04)
    assert later["ttft_p99_s"] == pytest.approx(plain["ttft_p99_s"] + 0.04)
    assert later["replica_of"] == plain["replica_of"]  # the routing does not see it
    assert rc.client_offset({"ttft_p50_s": plain["ttft_p50_s"] + 0.03}, plain) == pytest.approx(0.03)
    assert rc.client_offset({"ttft_p50_s": plain["ttft_p50_s"] - 0.03}, plain) == 0.0
