"""Fault injection on the study driver: resumes and extensions never simulate a config twice, a second driver
leaves the first one's trials alone, crashed trials are retried a bounded number of times and a run of crashes
stops the study, SIGTERM is as graceful as SIGINT, an unreachable Ray address fails at once, drivers started at
the same instant share one storage."""

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

from optimizer import (
    Executor,
    InProcessExecutor,
    SimBackend,
    StudySpec,
    StudyStopped,
    TrialBackend,
    TrialOutcome,
    Tuner,
    is_finished,
    open_study,
    prepare,
    recover_interrupted,
)
from optimizer._executors import check_reachable
from optimizer._storage import DRIVER_ATTR, driver_identity, mark_driver, trial_metrics
from sim.errors import ConfigError

TrialState = optuna.trial.TrialState
REPO = Path(__file__).resolve().parents[2]


class CountingBackend(TrialBackend):
    """Test-only: the simulator, counting how often each config is simulated."""

    name = "counting"

    def __init__(self, inner: SimBackend):
        self.inner = inner
        self.calls: dict[str, int] = {}

    def prepare(self, seeds):
        self.inner.prepare(seeds)

    def run(self, params, seeds):
        key = json.dumps({k: params[k] for k in sorted(params)}, default=str)
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.inner.run(params, seeds)


def _spec(**changes):
    d = spec_dict(**changes)
    d["workload"]["max_requests"] = 60
    return StudySpec.from_dict(d)


def _tuner(spec, storage, trials, backend=None, executor=None, **kwargs):
    return Tuner(spec, trials=trials, storage=storage, backend=backend, executor=executor or InProcessExecutor(),
                 progress=io.StringIO(), **kwargs)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_extending_a_study_never_simulates_a_config_twice(tmp_path, sampler):
    spec = _spec(sampler={"name": sampler, "seed": 0})
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    backend = CountingBackend(SimBackend(spec.workload, spec.model, spec.gpu))
    _tuner(spec, storage, 6, backend).run()
    _tuner(spec, storage, 12, backend).run()
    assert backend.calls and max(backend.calls.values()) == 1  # no config simulated twice
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert sum(is_finished(t) for t in trials) == 12
    fresh = [t for t in trials if "duplicate_of" not in t.user_attrs]
    # The second run drew new configs: seeded from the spec's seed plus the 6 stored trials, not from trial 0.
    assert len({json.dumps(t.params, sort_keys=True) for t in fresh}) == len(fresh) == len(backend.calls)
    for t in trials:
        if "duplicate_of" in t.user_attrs:
            source = trials[t.user_attrs["duplicate_of"]]
            assert t.params == source.params and t.values == source.values
            assert "output_buckets" in t.user_attrs  # the source's attrs copied, the grouped ones as they are
            assert json.dumps(trial_metrics(t), sort_keys=True) == json.dumps(trial_metrics(source), sort_keys=True)


def test_a_small_space_reuses_results_instead_of_rerunning(tmp_path):
    # Two configs only: whatever the sampler draws after them is a repeat, told from the stored result.
    spec = _spec(search={"base": "none", "max_num_seqs": [32, 64]}, sampler={"name": "random", "seed": 0})
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    backend = CountingBackend(SimBackend(spec.workload, spec.model, spec.gpu))
    result = _tuner(spec, storage, 6, backend).run()
    assert result.finished == 6 and result.complete == 6
    # The default config (trial 0) and the two searched configs, each simulated once.
    assert len(backend.calls) == 3 and set(backend.calls.values()) == {1}


def _orphan(spec, storage, driver):
    study = open_study(prepare(spec), storage)
    trial = study.ask()
    spec.search.suggest(trial)
    if driver is not None:
        mark_driver(study, trial, driver)
    return trial.number


def test_a_second_driver_leaves_a_live_drivers_trial_alone(tmp_path):
    spec = _spec()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    live = driver_identity()
    number = _orphan(spec, storage, live)
    study = open_study(prepare(spec), storage)
    assert recover_interrupted(study) == []  # its driver (this process) is alive
    assert study.trials[number].state == TrialState.RUNNING
    # The budget counts the other driver's running trial: 3 asked for, this driver runs 2.
    result = _tuner(spec, storage, 3).run()
    assert result.ran == 2 and result.recovered == []
    assert optuna.load_study(study_name=spec.name, storage=storage).trials[number].state == TrialState.RUNNING


def test_a_dead_drivers_trial_is_recovered_at_once(tmp_path):
    spec = _spec()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {"host": os.uname().nodename, "pid": int(child.stdout), "started": 1.0}
    number = _orphan(spec, storage, dead)
    result = _tuner(spec, storage, 2).run()
    assert result.recovered == [number]
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert trials[number].user_attrs["fail_kind"] == "interrupted"
    assert trials[number].system_attrs[DRIVER_ATTR]["pid"] == dead["pid"]


class CrashingExecutor(Executor):
    """Test-only: every trial's worker 'dies' (as a Ray worker killed by the OOM killer would)."""

    def __init__(self):
        self._pending: list[int] = []
        self.submitted = 0

    @property
    def capacity(self):
        return 1

    @property
    def running(self):
        return len(self._pending)

    def submit(self, number, backend, params, seeds, timeout_s=None):
        self.submitted += 1
        self._pending.append(number)

    def wait(self, timeout_s=None):
        out = [TrialOutcome(n, None, "crashed", "worker died (ActorDiedError): killed") for n in self._pending]
        self._pending.clear()
        return out


def test_crashes_are_retried_then_a_run_of_them_stops_the_study(tmp_path):
    spec = _spec(sampler={"name": "random", "seed": 0})
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    executor = CrashingExecutor()
    with pytest.raises(StudyStopped, match="5 trials in a row lost their Ray worker"):
        _tuner(spec, storage, 20, executor=executor, crash_retries=2, max_consecutive_crashes=5).run()
    assert executor.submitted == 5  # not the budget of 20
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    crashed = [t for t in trials if t.user_attrs.get("fail_kind") == "crashed"]
    assert len(crashed) == 5
    # The first config ran 3 times (2 retries), the same params each time, then counted as failed.
    first = [t for t in crashed if t.params == crashed[0].params]
    assert [t.user_attrs.get("retried", False) for t in first] == [True, True, False]
    assert sum(is_finished(t) for t in trials) == 1


def test_sigterm_stops_gracefully_and_the_trial_reruns(tmp_path):
    proc, _, storage, _ = start_slow_tune(tmp_path, "--in-process", cwd=REPO)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated (SIGTERM); run the same command again to resume" in err
    trials = optuna.load_study(study_name="conv-l40s", storage=storage).trials
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["fail_kind"] == "interrupted"
    assert "SIGTERM" in trials[0].user_attrs["fail_reason"]
    assert trials[1].state == TrialState.WAITING  # re-runnable: enqueued with the same params
    assert trials[1].system_attrs["fixed_params"] == trials[0].params


def test_an_unreachable_ray_address_fails_at_once(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="cannot reach Ray at 127.0.0.1:1"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(ConfigError, match="out of range"):
        check_reachable("127.0.0.1:99999")
    path = write_spec(tmp_path, spec_dict(budget={"trials": 1}))
    run = subprocess.run([sys.executable, "-m", "optimizer.cli", "tune", str(path), "--address", "127.0.0.1:1",
                          "--storage", f"sqlite:///{tmp_path / 'db'}", "--no-export"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]  # one line
    assert "cannot reach Ray at 127.0.0.1:1" in run.stderr
    assert time.monotonic() - t0 < 100  # not ray.init's minutes of retries


def test_drivers_started_at_the_same_instant_share_the_storage(tmp_path):
    path = write_spec(tmp_path, spec_dict())
    storage = f"sqlite:///{tmp_path / 'fresh.db'}"
    script = ("import sys; from optimizer import load_study_spec, open_study, prepare\n"
              "ctx = prepare(load_study_spec(sys.argv[1]))\n"
              "study = open_study(ctx, sys.argv[2]); print(study.study_name)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), storage], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {"conv-l40s"}
    assert len(optuna.get_all_study_summaries(storage)) == 1


def test_an_out_folder_that_cannot_be_written_fails_before_the_study(tmp_path):
    path = write_spec(tmp_path, spec_dict(budget={"trials": 1}))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    run = subprocess.run([sys.executable, "-m", "optimizer.cli", "tune", str(path), "--in-process",
                          "--storage", f"sqlite:///{tmp_path / 'db'}", "--out", str(blocker / "out")], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"--out: cannot write to {blocker / 'out'}" in run.stderr
    assert not (tmp_path / "db").exists()  # refused before any trial ran


@pytest.mark.slow
def test_two_drivers_at_once_share_the_budget(tmp_path):
    """Two `kvtune tune` on one storage at the same time (what a user with two machines does): both finish
    cleanly, the budget is shared, and no config is simulated twice."""
    path = write_spec(tmp_path, spec_dict(budget={"trials": 8}, sampler={"name": "random", "seed": 0},
                                          workload={**spec_dict()["workload"], "max_requests": 60}))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = [sys.executable, "-m", "optimizer.cli", "tune", str(path), "--in-process", "--storage", storage,
           "--no-export"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert not any("Traceback" in err or "UpdateFinishedTrialError" in err for _, err in outs)
    trials = optuna.load_study(study_name="conv-l40s", storage=storage).trials
    finished = sum(is_finished(t) for t in trials)
    assert 8 <= finished <= 9  # two drivers asking at the same instant may overshoot by one, never more
    assert not any(t.state == TrialState.RUNNING for t in trials)
    fresh = [json.dumps(t.params, sort_keys=True) for t in trials
             if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(fresh) == len(set(fresh))  # a config the other driver ran (or runs) is copied, not re-simulated
