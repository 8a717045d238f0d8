"""Resume: running the same study again continues from storage.  Finished trials are kept and counted once;
trials a killed driver left RUNNING are failed as interrupted and re-run with the same parameters."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optimizer_test_helpers import spec_dict, write_spec

from optimizer import InProcessExecutor, StudySpec, Tuner, is_finished, open_study, prepare
from sim.errors import ConfigError

TrialState = optuna.trial.TrialState
REPO = Path(__file__).resolve().parents[2]


def _run(spec, storage, trials):
    return Tuner(spec, trials=trials, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()


def _snapshot(storage, name):
    study = optuna.load_study(study_name=name, storage=storage)
    return {t.number: (t.state, t.params, t.values) for t in study.trials}


def test_more_trials_in_the_same_storage(tmp_path):
    spec = StudySpec.from_dict(spec_dict())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = _run(spec, storage, 5)
    assert (first.finished, first.ran) == (5, 5)
    before = _snapshot(storage, spec.name)
    second = _run(spec, storage, 10)
    assert (second.finished, second.ran) == (10, 5)
    after = _snapshot(storage, spec.name)
    assert sorted(after) == list(range(10))
    for number, state in before.items():
        assert after[number] == state  # nothing finished is lost or re-run
    # Asking for what is already there runs nothing.
    assert _run(spec, storage, 8).ran == 0


def test_a_trial_left_running_is_rerun(tmp_path):
    spec = StudySpec.from_dict(spec_dict())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    _run(spec, storage, 3)
    # A driver that died mid-trial: a trial asked for, its params drawn, never told.
    ctx = prepare(spec)
    study = open_study(ctx, storage)
    orphan = study.ask()
    spec.search.suggest(orphan)
    left = study.trials[orphan.number]
    assert left.state == TrialState.RUNNING
    params = left.params

    result = _run(spec, storage, 6)
    assert result.recovered == [orphan.number]
    assert result.finished == 6 and result.ran == 3
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    dead = trials[orphan.number]
    assert dead.state == TrialState.FAIL
    assert dead.user_attrs["fail_kind"] == "interrupted"
    retries = [t for t in trials if t.user_attrs.get("retry_of") == orphan.number]
    assert len(retries) == 1
    assert retries[0].state == TrialState.COMPLETE and retries[0].params == params
    # The interrupted trial does not count: 6 finished = 3 before + the retry + 2 new.
    assert sum(is_finished(t) for t in trials) == 6 and len(trials) == 7
    # A second resume finds nothing left running and re-enqueues nothing.
    again = _run(spec, storage, 6)
    assert again.recovered == [] and again.ran == 0


def test_a_changed_spec_is_refused(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    _run(StudySpec.from_dict(spec_dict()), storage, 1)
    changed = StudySpec.from_dict(spec_dict(search={"max_num_seqs": {"low": 8, "high": 64}}))
    with pytest.raises(ConfigError) as info:
        _run(changed, storage, 2)
    assert info.value.field == "search" and "different search" in str(info.value)
    other = StudySpec.from_dict(spec_dict(objectives=["goodput_rps", "p99_e2e_s:conv"]))
    with pytest.raises(ConfigError) as info:
        _run(other, storage, 2)
    assert info.value.field == "objectives"


#: Put first on the killed driver's PYTHONPATH: its 5th simulated trial says so in a file and then hangs, so the
#: test kills it mid-trial with 4 trials done however fast trials are (no race against the study's end).
_HANG_AT_FIFTH_TRIAL = """
import os, time
from optimizer._backend import SimBackend
_run, _calls = SimBackend.run, [0]
def run(self, params, seeds):
    _calls[0] += 1
    if _calls[0] == 5:
        open(os.environ["KVTUNE_TEST_HANG_MARKER"], "w").close()
        time.sleep(3600)
    return _run(self, params, seeds)
SimBackend.run = run
"""


@pytest.mark.slow
def test_killed_driver_process(tmp_path):
    """SIGKILL a real `kvtune tune` process mid-study, then run the same command again."""
    path = write_spec(tmp_path, spec_dict(budget={"trials": 12}))
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    cmd = [sys.executable, "-m", "optimizer.cli", "tune", str(path), "--in-process", "--storage", storage,
           "--out", str(tmp_path / "out"), "--no-export"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HANG_AT_FIFTH_TRIAL)
    marker = tmp_path / "hanging"
    killed_env = {**env, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "KVTUNE_TEST_HANG_MARKER": str(marker)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=killed_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # (only a bound on a broken run: the driver hangs at its 5th trial)
        while time.monotonic() < deadline and proc.poll() is None and not marker.exists():
            time.sleep(0.2)
        assert marker.exists() and proc.poll() is None, "the driver never reached its 5th trial"
        study = optuna.load_study(study_name="conv-l40s", storage=storage)
        assert sum(t.state == TrialState.COMPLETE for t in study.trials) >= 4
        assert any(t.state == TrialState.RUNNING for t in study.trials)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    before = {t.number: (t.state, t.values) for t in optuna.load_study(study_name="conv-l40s", storage=storage).trials}
    running = [n for n, (state, _) in before.items() if state == TrialState.RUNNING]

    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    trials = optuna.load_study(study_name="conv-l40s", storage=storage).trials
    assert sum(is_finished(t) for t in trials) == 12
    for number, (state, values) in before.items():
        if state == TrialState.COMPLETE:
            assert trials[number].state == TrialState.COMPLETE and trials[number].values == values
    for number in running:
        assert trials[number].user_attrs["fail_kind"] == "interrupted"
        assert any(t.user_attrs.get("retry_of") == number and t.state == TrialState.COMPLETE for t in trials)
