"""The study's ask-ahead (``Executor.asks_ahead``, Ray's executor): while every worker is busy, the driver asks
Optuna for the next trial and holds it; when a worker frees, the held trial is submitted before the trial that
ended is told, so the worker waits for a submit instead of a tell and an ask.  The budget is kept (no trial is
asked beyond it), and a study stopped with a trial held tells it ``interrupted`` and enqueues it again."""

from __future__ import annotations

import io
import os

import optuna
import pytest
from optimizer_test_helpers import spec_dict

from optimizer import InProcessExecutor, SimBackend, StudySpec, Tuner, is_finished

TrialState = optuna.trial.TrialState


class RecordingExecutor(InProcessExecutor):
    """Test-only: one trial at a time (as InProcessExecutor), recording at each submit the stored state of the
    trial submitted before it."""

    def __init__(self, storage: str, name: str, asks_ahead: bool):
        super().__init__()
        self.asks_ahead = asks_ahead
        self.storage, self.name = storage, name
        self.submitted: list[int] = []
        self.previous_state: list[TrialState] = []

    def submit(self, number, backend, params, seeds, timeout_s=None):
        if self.submitted:
            trials = optuna.load_study(study_name=self.name, storage=self.storage).get_trials(deepcopy=False)
            self.previous_state.append(trials[self.submitted[-1]].state)
        self.submitted.append(number)
        super().submit(number, backend, params, seeds, timeout_s)


class InterruptedExecutor(RecordingExecutor):
    """Test-only: Ctrl-C arrives during the third wait (one trial running, one held)."""

    def wait(self, timeout_s=None):
        if len(self.submitted) == 3:
            raise KeyboardInterrupt
        return super().wait(timeout_s)


def _spec():
    d = spec_dict(sampler={"name": "random", "seed": 0})
    d["workload"]["max_requests"] = 60
    return StudySpec.from_dict(d)


@pytest.mark.parametrize("asks_ahead", [True, False])
def test_the_held_trial_starts_before_the_ended_one_is_told(tmp_path, asks_ahead):
    spec = _spec()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    executor = RecordingExecutor(storage, spec.name, asks_ahead)
    result = Tuner(spec, trials=5, storage=storage, executor=executor, progress=io.StringIO(),
                   backend=SimBackend(spec.workload, spec.model, spec.gpu)).run()
    assert (result.finished, result.complete) == (5, 5)
    assert executor.submitted == [0, 1, 2, 3, 4]  # the budget: none asked beyond it
    # Asked ahead, each trial is submitted while the one before it is still running (told after); without, it
    # is asked after the one before it was told.
    expected = TrialState.RUNNING if asks_ahead else TrialState.COMPLETE
    assert executor.previous_state == [expected] * 4
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert len(trials) == 5 and all(t.state == TrialState.COMPLETE for t in trials)


def test_a_stopped_study_enqueues_the_held_trial_again(tmp_path):
    spec = _spec()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    executor = InterruptedExecutor(storage, spec.name, asks_ahead=True)
    backend = SimBackend(spec.workload, spec.model, spec.gpu)
    with pytest.raises(KeyboardInterrupt):
        Tuner(spec, trials=6, storage=storage, executor=executor, progress=io.StringIO(), backend=backend).run()
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    # 0 and 1 ran; 2 was running and 3 held when Ctrl-C came: both told interrupted and enqueued again.
    assert executor.submitted == [0, 1, 2]
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE] * 2
    assert [t.user_attrs.get("fail_kind") for t in trials[2:4]] == ["interrupted"] * 2
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert sum(t.state == TrialState.WAITING for t in trials) == 2
    # The same command resumes: the two enqueued configs run, and the study ends at its 6 trials.
    resumed = RecordingExecutor(storage, spec.name, asks_ahead=True)
    result = Tuner(spec, trials=6, storage=storage, executor=resumed, progress=io.StringIO(), backend=backend).run()
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert (result.finished, result.complete) == (6, 6)
    rerun = {tuple(sorted(t.params.items())) for t in trials if t.number in resumed.submitted}
    assert {tuple(sorted(trials[n].params.items())) for n in (2, 3)} <= rerun
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    assert sum(is_finished(t) for t in trials) == 6


def test_ray_asks_ahead_only_where_the_driver_has_a_cpu_of_its_own():
    from optimizer._executors import RayExecutor

    cpus = len(os.sched_getaffinity(0))
    local = RayExecutor()
    local._capacity = cpus  # every CPU runs a trial: asking ahead would only take CPU from them
    assert not local.asks_ahead
    local._capacity = max(1, cpus - 1)
    assert local.asks_ahead == (cpus > 1)
    remote = RayExecutor("ray://head:10001")
    remote._capacity = cpus
    assert remote.asks_ahead
    assert not InProcessExecutor().asks_ahead
