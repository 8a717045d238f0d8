"""The at-scale workloads' pace (benchmarks/real_engine/workloads.py, ``run.py --pace``, issue 32): the same requests,
arrivals and client timeouts compressed by the pace, and a measurement folder that holds one pace only.  No engine."""

from __future__ import annotations

import json

import pytest
from real_engine_helpers import load_benchmark


@pytest.fixture(scope="module")
def modules():
    run = load_benchmark("run.py", "real_engine_bench_pace")
    import workloads  # run.py put its folder on sys.path

    return workloads, run


@pytest.mark.parametrize("name", ["saturated", "kv-pressure", "reasoning-long", "prefix-scarce"])
def test_pace_compresses_time_and_keeps_the_requests(modules, name):
    workloads, _ = modules
    slow, fast = workloads.build(name), workloads.build(name, 2.5)
    a, b = slow.requests, fast.requests
    assert len(a) == len(b) == workloads.SCALE_REQUESTS
    for col in ("request_id", "class", "prompt_tokens", "output_tokens"):
        assert a[col].tolist() == b[col].tolist()
    assert b["arrival_s"].to_numpy() == pytest.approx(a["arrival_s"].to_numpy() / 2.5)
    assert a["arrival_s"].max() > 0
    for klass, c in slow.classes.items():
        t = fast.classes[klass].timeout_s
        assert (t is None and c.timeout_s is None) or t == pytest.approx(c.timeout_s / 2.5)
    if "hash_ids" in a:
        assert a["hash_ids"].tolist() == b["hash_ids"].tolist()


def test_pace_is_for_the_at_scale_workloads_only(modules):
    workloads, _ = modules
    with pytest.raises(ValueError, match="at-scale"):
        workloads.build("azure", 2.0)
    assert len(workloads.build("azure").requests) > 0


def test_a_folder_holds_one_pace_and_size(modules, tmp_path):
    _, run = modules
    from sim.errors import ConfigError

    assert run.out_scale(tmp_path) == (1.0, 150)
    assert run.out_scale(tmp_path, 2.5, 600) == (2.5, 600)
    assert json.loads((tmp_path / "pace.json").read_text()) == {"pace": 2.5, "requests": 600}
    assert run.out_scale(tmp_path) == (2.5, 600)  # a later call (--report-only) reads it
    assert run.out_scale(tmp_path, 2.5) == (2.5, 600)
    with pytest.raises(ConfigError, match="pace 2.5"):
        run.out_scale(tmp_path, 3.0)
    with pytest.raises(ConfigError, match="requests 600"):
        run.out_scale(tmp_path, None, 300)
    old = tmp_path / "old"
    (old / "default" / "saturated" / "rep-0").mkdir(parents=True)
    (old / "default" / "saturated" / "rep-0" / "replay.json").write_text("{}")
    with pytest.raises(ConfigError, match="pace 1"):
        run.out_scale(old, 2.0)
    assert run.out_scale(old, 1.0) == (1.0, 150)
    with pytest.raises(ConfigError, match="positive"):
        run.out_scale(tmp_path / "x", 0.0)
    with pytest.raises(ConfigError, match="at least 150"):
        run.out_scale(tmp_path / "y", 2.0, 100)


def test_requests_sizes_the_draw(modules):
    workloads, _ = modules
    big = workloads.build("saturated", 4.0, 600)
    assert len(big.requests) == 600
    assert big.requests["arrival_s"].is_monotonic_increasing


def test_bad_pace_is_one_line_and_exit_2(modules, tmp_path, capsys):
    _, run = modules
    code = run.main(["--scale", "--report-only", "--pace", "-1", "--profile", "p.yaml", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pace" in err[0]
