"""A study against an existing Ray cluster: a head started with `ray start --head` as its own process, the study
run with --address, then that head stopped by its own process id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optimizer_test_helpers import spec_dict, write_spec

from optimizer.cli import main

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    saved_address = os.environ.get("RAY_ADDRESS")
    port = _free_port()
    log = tmp_path / "head.log"
    # Token auth off on both sides: the test driver does not carry the head's token.
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    with open(log, "w") as out:
        head = subprocess.Popen(
            ["ray", "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats", "--block"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "ray head did not start:\n" + log.read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        # ray.init(address=...) exports RAY_ADDRESS; later plain ray.init() calls must not find this head.
        if saved_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved_address
        os.kill(head.pid, signal.SIGTERM)  # the head we started, by its own process id
        try:
            head.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)  # its session, started above: nothing else is in it
            head.wait(timeout=15)


@pytest.mark.slow
def test_study_on_an_existing_cluster(tmp_path, ray_head, capsys, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    d = spec_dict(budget={"trials": 6, "trial_timeout_s": 120})
    d["workload"]["max_requests"] = 150
    path = write_spec(tmp_path, d)
    out = tmp_path / "out"
    code = main(["tune", str(path), "--address", ray_head, "--out", str(out), "--no-export"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"Ray ({ray_head}, 2 CPUs, 2 trials at once)" in captured.err
    assert "6/6 trials finished (6 complete, 0 failed" in captured.out
    study = optuna.load_study(study_name=d["name"], storage=f"sqlite:///{(out / 'study.db').resolve()}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 6
    import ray

    assert not ray.is_initialized()  # the driver disconnected; the cluster is the fixture's to stop
