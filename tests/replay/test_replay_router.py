"""``kvtune replay`` routing across several servers with a kvtune router (two twins as the engines)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from optimizer.cli import main
from replay import ReplayOptions, free_port, replay
from replay_test_helpers import GPU, MODEL, make_workload, running_twin
from sim.engine.config import EngineConfig
from sim.fleet import simulate_fleet
from sim.profiles import load_gpu, load_model
from sim.workload.classes import RequestClass

SPEED = 20.0


@pytest.fixture(scope="module")
def two_twins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twins")
    with running_twin({"max_model_len": 4096}, speed=SPEED, tmp_path=tmp) as a, \
            running_twin({"max_model_len": 4096}, speed=SPEED, tmp_path=tmp) as b:
        yield a, b


def test_round_robin_across_two_urls(two_twins, tmp_path, capsys):
    a, b = two_twins
    rc = main(["replay", "--url", a, "--url", b, "--router", "round_robin", "--model", MODEL, "--head", "12",
               "--rate-scale", "20", "--speed", str(SPEED), "--out", str(tmp_path), "--sample-interval", "0.1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "12 requests" in out and f"requests per replica: {a} 6, {b} 6" in out
    (run,) = tmp_path.glob("trial-*/seed-0")
    requests = pd.read_parquet(run / "requests.parquet")
    assert requests["replica"].tolist() == [0, 1] * 6
    assert (requests["status"] == "finished").all()
    meta = json.loads((run / "replay.json").read_text())
    info = meta["info"]
    assert info["router"] == "round_robin" and info["urls"] == [a, b]
    assert meta["engine"]["urls"] == [a, b]
    for r, rep in enumerate(info["replicas"]):
        assert rep["url"] == [a, b][r] and rep["requests"] == 6
        # Each twin counted exactly the prompts routed to it.
        sent = int(requests.loc[requests["replica"] == r, "prompt_tokens"].sum())
        assert rep["metrics_after"]["prompt_tokens_total"] - rep["metrics_before"]["prompt_tokens_total"] == sent
    # The run's counters are both servers' together.
    assert meta["metrics_after"]["prompt_tokens_total"] - meta["metrics_before"]["prompt_tokens_total"] == \
        int(requests["prompt_tokens"].sum())


def _sessions_workload():
    """Two sessions of four requests, alternating; each prompt is its session's 512-token prefix (hash id 1 or 2)
    and a 512-token block of its own.  The two sessions' first requests arrive together, so the second finds the
    first in flight (sglang_cache_aware's miss rule: the least-loaded replica)."""
    rows, hashes = [], []
    for k in range(8):
        rows.append(("chat", 0.4 * max(k, 1) - 0.4, 1024, 4))
        hashes.append([1 + k % 2, 100 + k])
    wl = make_workload(rows, {"chat": RequestClass("chat")})
    df = wl.requests.copy()
    df["hash_ids"] = hashes
    df["session_id"] = [k % 2 for k in range(8)]
    return wl.with_requests(df)


def test_cache_aware_keeps_sessions_together_as_the_fleet_model_does(two_twins):
    workload = _sessions_workload()
    result = replay(list(two_twins), workload, ReplayOptions(speed=SPEED, router="sglang_cache_aware",
                                                             sample_interval_wall_s=0.1))
    placed = result.requests["replica"].tolist()
    assert (result.requests["status"] == "finished").all()
    # Each session's requests stay on one replica, the two sessions on different ones.
    assert len({placed[k] for k in range(0, 8, 2)}) == 1 and len({placed[k] for k in range(1, 8, 2)}) == 1
    assert placed[0] != placed[1]
    # The same decisions as the router inside kvtune's simulated fleet, on the same trace.
    fleet = simulate_fleet(workload, EngineConfig(max_model_len=4096), load_model(MODEL), load_gpu(GPU), replicas=2,
                           router="sglang_cache_aware")
    assert fleet.requests["replica"].tolist() == placed
    assert result.info["router_params"]["cache_threshold"] == pytest.approx(0.3)


@pytest.mark.parametrize("router", ["least_outstanding", "sglang_cache_aware"])
def test_the_table_holds_the_spans_the_router_counted(two_twins, router):
    # routed_s / router_end_s are when the router placed each request and stopped counting it: fed the loads they
    # give at each placement, the same router makes every decision again.  (router_check.py rebuilds a real run's
    # loads this way; from arrival_s / end_s instead, a loaded client's lag makes some decisions look wrong.)
    from sim.fleet import ReplicaView, RequestView, make_router
    from sim.runner import RequestStore

    workload = _sessions_workload()
    df = workload.requests.copy()
    df["arrival_s"] = [0.0, 0.0, 0.05, 0.3, 0.3, 0.35, 0.9, 0.95]  # overlapping requests: loads of 0-3
    workload = workload.with_requests(df)
    req = replay(list(two_twins), workload, ReplayOptions(speed=SPEED, router=router)).requests
    assert (req["status"] == "finished").all()
    routed, released, placed = req["routed_s"].to_numpy(), req["router_end_s"].to_numpy(), req["replica"].to_numpy()
    assert (routed >= req["arrival_s"].to_numpy() - 1e-9).all() and (released > routed).all()
    model = make_router(router, {}, 2)
    keys = RequestStore(workload, EngineConfig(block_size=16, enable_prefix_caching=True), 0,
                        workload.hash_block_tokens, None, False).keys  # as the replay makes them (router_block_size)
    loads_seen = set()
    for i in sorted(range(len(req)), key=lambda k: routed[k]):
        busy = (routed < routed[i]) & (released > routed[i])
        loads = [int((busy & (placed == r)).sum()) for r in range(2)]
        loads_seen.add(tuple(loads))
        view = RequestView(index=i, arrival_s=float(routed[i]), class_name="chat",
                           prompt_tokens=int(df["prompt_tokens"].iloc[i]), block_hashes=keys[i], block_size=16)
        assert model.route(view, [ReplicaView(index=r, routed=0, outstanding=loads[r]) for r in range(2)]) == \
            placed[i], (i, loads)
    assert len(loads_seen) > 1  # the loads differed between decisions: the check could fail


@pytest.mark.parametrize("interval", [0.05, 0.0])
def test_router_reads_each_servers_metrics(two_twins, interval):
    # With no sampler (interval 0) the router has only the scrape before the run: every server's figures from the
    # first request on (the first arrival used to be routed before any scrape, and min() met a None).
    workload = _sessions_workload()
    result = replay(list(two_twins), workload, ReplayOptions(speed=SPEED, router="least_kv_usage",
                                                             sample_interval_wall_s=interval))
    assert set(result.requests["replica"]) <= {0, 1} and (result.requests["status"] == "finished").all()
    assert sum(r["requests"] for r in result.info["replicas"]) == 8


def test_a_server_without_metrics_is_refused_before_a_metric_router_routes(two_twins, monkeypatch):
    import replay.loadgen as loadgen

    scrape = loadgen._Replay._scrape_all  # noqa: SLF001

    async def second_silent(self, session):
        texts = await scrape(self, session)
        return [texts[0], None]

    monkeypatch.setattr(loadgen._Replay, "_scrape_all", second_silent)  # noqa: SLF001
    with pytest.raises(loadgen.ServerError, match="serves no /metrics, which router 'least_kv_usage' reads"):
        replay(list(two_twins), _sessions_workload(), ReplayOptions(speed=SPEED, router="least_kv_usage"))


@pytest.mark.parametrize("extra, flag, words", [
    (["--router", "no_such_router"], "--router", "unknown router 'no_such_router'"),
    (["--router", "sglang_cache_aware", "--router-param", "cache_threshold=2"], "--router-param cache_threshold",
     "out of range"),
    (["--router", "sglang_cache_aware", "--router-param", "cache_threshold=high"], "--router-param cache_threshold",
     "expected a number"),
    (["--router", "round_robin", "--router-param", "nope=1"], "--router-param nope", "no such parameter"),
    (["--router-param", "nope"], "--router-param", "NAME=VALUE"),
])
def test_bad_router_input_is_one_line_exit_2(two_twins, capsys, extra, flag, words):
    a, b = two_twins
    rc = main(["replay", "--url", a, "--url", b, "--model", MODEL, "--out", "unused", *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"kvtune: error: {flag}") and words in err and err.count("\n") == 1, err


def test_unreachable_url_is_one_line_exit_2(two_twins, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    rc = main(["replay", "--url", two_twins[0], "--url", dead, "--model", MODEL, "--out", "unused"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"kvtune: error: --url: {dead} cannot be reached") and err.count("\n") == 1, err


def test_router_needs_urls(capsys):
    rc = main(["replay", "--launch", "twin", "--model", MODEL, "--gpu", GPU, "--router", "round_robin",
               "--out", "unused"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("kvtune: error: --router:") and err.count("\n") == 1, err
