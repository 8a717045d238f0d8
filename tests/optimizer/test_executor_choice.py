"""Which executor a study runs on (issue 34): ``executor: auto`` picks forked worker processes for a small study
on this machine and Ray for a cluster address, a replay backend, a process already in a Ray, or a large study;
``--executor`` / the spec's ``executor:`` force one; the choice is printed; and the study's wall time is split
into start, trials, storage and shutdown, which sum to it (printed by ``kvtune tune`` and written to
``study_run.json``)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optimizer_test_helpers import spec_dict, start_slow_tune, write_spec

from optimizer import ProcessExecutor, SimBackend, StudySpec, Tuner, choose_executor, is_finished
from optimizer._executors import LARGE_STUDY_RUNS
from optimizer.cli import main
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _spec(**changes) -> StudySpec:
    d = spec_dict(**changes)
    d["workload"]["max_requests"] = 60
    return StudySpec.from_dict(d)


@pytest.mark.parametrize(("kwargs", "kind", "why"), [
    ({"trials": 40}, "process", "small study"),
    ({"trials": 40, "address": "ray://head:10001"}, "ray", "cluster address"),
    ({"trials": 40, "replay": True}, "ray", "replay"),
    ({"trials": LARGE_STUDY_RUNS}, "ray", "large study"),
    ({"trials": LARGE_STUDY_RUNS // 2, "replicates": 2}, "ray", "large study"),  # simulations, not trials
    ({"trials": LARGE_STUDY_RUNS - 1}, "process", "small study"),
])
def test_auto_choice(monkeypatch, kwargs, kind, why):
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # no Ray joined in this process
    chosen, reason = choose_executor("auto", **kwargs)
    assert chosen == kind and why in reason


def test_a_process_in_a_ray_stays_on_it(monkeypatch):
    class _Ray:
        @staticmethod
        def is_initialized():
            return True

    monkeypatch.setitem(sys.modules, "ray", _Ray())
    assert choose_executor("auto", trials=4)[0] == "ray"


@pytest.mark.parametrize("kind", ["ray", "process", "in-process"])
def test_forced_kinds(kind):
    assert choose_executor(kind, trials=4, address="ray://head:10001") == (kind, "asked for")


def test_spec_key_and_bad_values():
    assert _spec().executor == "auto"
    assert _spec(executor="in-process").executor == "in-process"
    assert _spec(executor="process").to_dict()["executor"] == "process"
    with pytest.raises(ConfigError) as info:
        _spec(executor="threads")
    assert info.value.field == "executor"


def test_tuner_uses_the_chosen_executor_and_splits_its_wall_time(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    spec = _spec(budget={"trials": 4})
    progress = io.StringIO()
    tuner = Tuner(spec, storage=f"sqlite:///{tmp_path / 'study.db'}", out=tmp_path, progress=progress)
    result = tuner.run()
    assert result.finished == 4 and result.complete == 4
    assert result.executor == "process" and "small study" in result.executor_reason
    assert "ray" not in sys.modules  # Ray was neither started nor imported
    text = progress.getvalue()
    assert "on worker processes (local" in text and "kvtune: executor process: a small study" in text
    split = result.split
    assert list(split) == ["start", "trials", "storage", "shutdown"]
    assert all(v >= 0 for v in split.values())
    assert abs(sum(split.values()) - result.wall_s) < 1e-6
    record = result.to_dict()
    assert abs(sum(record["split_s"].values()) - record["wall_s"]) <= 0.003  # rounding of four parts


def test_forced_in_process(tmp_path):
    spec = _spec(budget={"trials": 2}, executor="in-process")
    result = Tuner(spec, storage="memory", out=tmp_path, progress=io.StringIO()).run()
    assert result.executor == "in-process" and result.executor_reason == "asked for" and result.complete == 2


def test_cli_prints_the_executor_and_the_split(tmp_path, capsys):
    d = spec_dict(budget={"trials": 3})
    d["workload"]["max_requests"] = 60
    path = write_spec(tmp_path, d)
    out = tmp_path / "run"
    code = main(["tune", str(path), "--executor", "process", "--out", str(out), "--no-export"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ran 3 now on process in" in captured.out
    for part in ("start", "trials", "storage", "shutdown"):
        assert f"{part} " in captured.out
    assert "kvtune: executor process: asked for" in captured.err
    record = json.loads((out / "study_run.json").read_text())
    assert record["executor"] == "process" and record["finished"] == 3
    assert set(record["split_s"]) == {"start", "trials", "storage", "shutdown"}
    assert abs(sum(record["split_s"].values()) - record["wall_s"]) <= 0.003


def test_process_workers_inherit_the_workload_and_stay_warm(tmp_path):
    spec = _spec()
    backend = SimBackend(spec.workload, spec.model, spec.gpu)
    backend.prepare([spec.workload.seed])
    executor = ProcessExecutor(workers=2)
    executor.start()
    try:
        for n in range(4):
            executor.submit(n, backend, {**spec.fixed_knobs(), "max_num_seqs": 16 * (n + 1)}, [spec.workload.seed],
                            timeout_s=120)
            if executor.running == executor.capacity:
                done = []
                while not done:
                    done = executor.wait(timeout_s=60)
                assert all(o.ok for o in done), done
        pids = {p.process.pid for p in executor._procs if p.process is not None}  # noqa: SLF001
        assert len(pids) == 2  # two warm workers ran every trial
    finally:
        executor.shutdown()
    assert executor.running == 0


def test_sigterm_with_worker_processes_resumes_without_rerunning(tmp_path):
    """A study on worker processes stopped by SIGTERM: the trial in flight is interrupted and enqueued again,
    the workers end with the driver, and the same command finishes the budget without re-running what ran."""
    proc, flag, storage, spec_path = start_slow_tune(tmp_path, "--executor", "process", "--workers", "1", cwd=tmp_path)
    worker = int(flag.read_text())
    time.sleep(1.0)  # the driver has asked its trial ahead by now (a stop mid-ask is test_study_faults' business)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    for _ in range(300):  # the worker was killed with the driver's executor
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"worker {worker} outlived the driver")
    State = optuna.trial.TrialState
    trials = optuna.load_study(study_name="conv-l40s", storage=storage).trials
    # The trial running and the one asked ahead (the worker leaves the driver a CPU): interrupted, enqueued again.
    interrupted = [t for t in trials if t.state == State.FAIL]
    waiting = [t.number for t in trials if t.state == State.WAITING]
    assert interrupted and all(t.user_attrs["fail_kind"] == "interrupted" for t in interrupted)
    assert len(waiting) == len(interrupted) and not any(t.state == State.COMPLETE for t in trials)
    rerun = subprocess.run([sys.executable, "-m", "optimizer.cli", "tune", str(spec_path), "--executor", "process",
                            "--storage", storage, "--no-export"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert rerun.returncode == 0, rerun.stderr
    trials = optuna.load_study(study_name="conv-l40s", storage=storage).trials
    assert sum(is_finished(t) for t in trials) == 2
    assert all(trials[n].state == State.COMPLETE for n in waiting[:2])  # the interrupted configs, run again
