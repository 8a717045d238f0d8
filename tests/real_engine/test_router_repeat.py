"""router_repeat.py: identical real runs of router_check.py against each other (offline parts, issue 31)."""

from __future__ import annotations

import json

import pytest
from real_engine_helpers import load_benchmark

WORKLOAD = {"requests": 12, "sessions": 3, "prefix_blocks": 2, "rate": 2.0, "seed": 3, "blocks": 300,
            "max_num_seqs": 32}


@pytest.fixture(scope="module")
def rr():
    return load_benchmark("router_repeat.py", "real_engine_router_repeat")


def _run(policy: str, replica_of: list[int], hits=(0.5, 0.25), workload=WORKLOAD) -> dict:
    n = len(replica_of)
    return {"workload": workload, "measured": {
        "policy": policy, "replica_of": replica_of, "sent_s": [float(i) for i in range(n)],
        "end_s": [i + 0.5 + 0.1 * (i % 3) for i in range(n)],
        "replicas": [{"requests": replica_of.count(r), "hit_rate": hits[r]} for r in range(2)]}}


def _write(tmp_path, name: str, runs: list[dict]):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "router_check.json").write_text(json.dumps(runs))
    return folder


def test_two_runs_are_compared_session_start_by_session_start(rr):
    wl = rr.rc.shared_prefix_workload(12, 3, 2, 2.0, 3)
    first = rr.first_requests(wl)
    a = [0] * 12
    b = list(a)
    b[int(first[1])] = 1  # one session's first request placed the other way in the second run
    policies = rr.by_policy([[_run("kvtune:least_outstanding", a)], [_run("kvtune:least_outstanding", b)]])
    (p,) = rr.pairs("kvtune:least_outstanding", policies["kvtune:least_outstanding"], first)
    assert (p["starts_moved"], p["starts"], p["same_replica"], p["n"]) == (1, 3, 11, 12)
    sims = [{"per": [{"sim_requests": 6, "sim_hit_rate": 0.5}, {"sim_requests": 6, "sim_hit_rate": 0.2}]}]
    e0, e1 = rr.summarise("kvtune:least_outstanding", policies["kvtune:least_outstanding"], sims)
    assert e0["counts"] == [12, 11] and e1["counts"] == [0, 1]
    assert e0["sim_count_err"] == pytest.approx(6 / 11.5 - 1)
    assert e0["run_count_dev"] == pytest.approx(0.5 / 11.5)


def test_a_real_routers_runs_are_relabelled_kvtunes_are_not(rr):
    a, b = [0, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 0]
    assert [of.tolist() for of in rr.aligned("cache_aware", [{"replica_of": a}, {"replica_of": b}])] == [a, a]
    assert [of.tolist() for of in rr.aligned("kvtune:sglang_cache_aware", [{"replica_of": a}, {"replica_of": b}])] \
        == [a, b]
    # hit rates follow the relabelling: the second run's e1 is the first run's e0
    sims = [{"per": [{"sim_requests": 3, "sim_hit_rate": 0.5}, {"sim_requests": 3, "sim_hit_rate": 0.5}]}]
    reals = [(0, _run("cache_aware", a, (0.6, 0.3))["measured"]), (1, _run("cache_aware", b, (0.3, 0.6))["measured"])]
    e0, e1 = rr.summarise("cache_aware", reals, sims)
    assert e0["hits"] == [0.6, 0.6] and e1["hits"] == [0.3, 0.3]


def test_policies_measured_once_are_left_out(rr):
    runs = [[_run("kvtune:least_outstanding", [0, 1]), _run("kvtune:dynamo_kv", [0, 1])],
            [_run("kvtune:least_outstanding", [1, 0])]]
    assert list(rr.by_policy(runs)) == ["kvtune:least_outstanding"]


def test_bad_input_is_one_line_exit_2(rr, tmp_path, capsys):
    one = _write(tmp_path, "one", [_run("kvtune:round_robin", [0, 1] * 6)])
    assert rr.main([str(one)]) == 2
    assert capsys.readouterr().err.strip() == "router_repeat.py: error: give two or more run folders"
    other = _write(tmp_path, "other", [_run("kvtune:round_robin", [0, 1] * 6, workload={**WORKLOAD, "seed": 4})])
    assert rr.main([str(one), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other/router_check.json: workload" in err and "one/router_check.json" in err
    assert rr.main([str(one), str(tmp_path / "missing")]) == 2
    assert "error: no " in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "router_check.json").write_text("[1, 2]")
    assert rr.main([str(one), str(tmp_path / "broken")]) == 2
    assert "broken/router_check.json: not a router_check.py measurement" in capsys.readouterr().err
    single = _write(tmp_path, "single", [_run("kvtune:dynamo_kv", [0, 1] * 6)])
    assert rr.main([str(one), str(single)]) == 2
    assert "no policy was measured in two" in capsys.readouterr().err
