"""Failed trials do not stop a study: a trial that raises, one that hangs past its timeout, and one whose Ray
worker process is killed (SIGKILL) are each told to Optuna as FAIL with the reason, and the others complete."""

from __future__ import annotations

import io
import math
import os
import signal
import sys
import time

import optuna
from optimizer_test_helpers import spec_dict

from optimizer import InProcessExecutor, ProcessExecutor, RayExecutor, SimBackend, StudySpec, TrialBackend, Tuner, open_study, prepare

TrialState = optuna.trial.TrialState
RAISES, HANGS, KILLED = 11, 12, 13


class FlakyBackend(TrialBackend):
    """Test-only: the simulator, except for three values of max_num_seqs."""

    name = "flaky"

    def __init__(self, inner: SimBackend):
        self.inner = inner

    def prepare(self, seeds):
        self.inner.prepare(seeds)

    def run(self, params, seeds):
        n = params["max_num_seqs"]
        if n == RAISES:
            raise RuntimeError("boom: the backend failed")
        if n == HANGS:
            time.sleep(600)
        if n == KILLED:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.run(params, seeds)


def _timeout_s(spec) -> int:
    """A trial timeout well above what a normal trial takes on this machine now (measured, CPU contention and
    all), so that only the hanging trial reaches it: 5x the slowest of the normal configs, at least 4 s."""
    backend = SimBackend(spec.workload, spec.model, spec.gpu)
    backend.prepare([spec.workload.seed])
    slowest = 0.0
    for n in (32, 64, 128):
        t0 = time.perf_counter()
        backend.run({**spec.fixed_knobs(), "max_num_seqs": n}, [spec.workload.seed])
        slowest = max(slowest, time.perf_counter() - t0)
    return max(4, math.ceil(5 * slowest))


def _study(tmp_path, values):
    d = spec_dict(search={"base": "none", "max_num_seqs": [RAISES, HANGS, KILLED, 32, 64, 128]},
                  sampler={"name": "random", "seed": 0}, budget={"trials": len(values)})
    d["workload"]["max_requests"] = 100
    d["budget"]["trial_timeout_s"] = _timeout_s(StudySpec.from_dict(d))
    spec = StudySpec.from_dict(d)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(prepare(spec), storage)
    for v in values:
        study.enqueue_trial({"max_num_seqs": v})
    backend = FlakyBackend(SimBackend(spec.workload, spec.model, spec.gpu))
    return spec, storage, backend


def _by_value(storage, name):
    study = optuna.load_study(study_name=name, storage=storage)
    return {t.params["max_num_seqs"]: t for t in study.trials}


def test_ray_trials_that_raise_hang_or_die(tmp_path, local_ray):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    spec, storage, backend = _study(tmp_path, [RAISES, HANGS, KILLED, 32, 64, 128])
    progress = io.StringIO()
    result = Tuner(spec, storage=storage, backend=backend, executor=RayExecutor(workers=2), progress=progress,
                   crash_retries=1).run()
    study = optuna.load_study(study_name=spec.name, storage=storage)
    why = [(t.number, t.params, t.user_attrs.get("fail_reason")) for t in study.trials]
    assert result.finished == 6 and result.failed == 3 and result.complete == 3, why
    killed = [t for t in study.trials if t.params["max_num_seqs"] == KILLED]
    # A dead worker is an infrastructure failure: its config ran once more (crash_retries=1), then counted.
    assert [t.user_attrs.get("retried", False) for t in killed] == [True, False]
    assert killed[1].user_attrs["retry_of"] == killed[0].number
    trials = _by_value(storage, spec.name)
    assert trials[RAISES].state == TrialState.FAIL
    assert trials[RAISES].user_attrs["fail_kind"] == "error"
    assert trials[RAISES].user_attrs["fail_reason"] == "RuntimeError: boom: the backend failed"
    assert trials[HANGS].state == TrialState.FAIL
    assert trials[HANGS].user_attrs["fail_kind"] == "timeout"
    assert f"timed out after {spec.budget.trial_timeout_s:g} s" in trials[HANGS].user_attrs["fail_reason"]
    assert trials[KILLED].state == TrialState.FAIL
    assert trials[KILLED].user_attrs["fail_kind"] == "crashed"
    assert "worker died" in trials[KILLED].user_attrs["fail_reason"]
    for v in (32, 64, 128):
        assert trials[v].state == TrialState.COMPLETE and trials[v].user_attrs["class.conv.e2e_s.p99"] > 0
    log = progress.getvalue()
    assert "failed (error): RuntimeError: boom" in log and "failed (timeout)" in log and "failed (crashed)" in log
    assert "trials 6/6 done (3 failed)" in log


def test_process_trials_that_raise_hang_or_die(tmp_path):
    """The same three failures on forked worker processes (ProcessExecutor, what ``executor: auto`` picks for a
    small study): each fails only its trial; the hung one's worker is killed at its timeout."""
    spec, storage, backend = _study(tmp_path, [RAISES, HANGS, KILLED, 32, 64, 128])
    progress = io.StringIO()
    result = Tuner(spec, storage=storage, backend=backend, executor=ProcessExecutor(workers=2), progress=progress,
                   crash_retries=1).run()
    study = optuna.load_study(study_name=spec.name, storage=storage)
    why = [(t.number, t.params, t.user_attrs.get("fail_reason")) for t in study.trials]
    assert result.finished == 6 and result.failed == 3 and result.complete == 3, why
    killed = [t for t in study.trials if t.params["max_num_seqs"] == KILLED]
    assert [t.user_attrs.get("retried", False) for t in killed] == [True, False]
    trials = _by_value(storage, spec.name)
    assert trials[RAISES].user_attrs["fail_kind"] == "error"
    assert trials[RAISES].user_attrs["fail_reason"] == "RuntimeError: boom: the backend failed"
    assert trials[HANGS].user_attrs["fail_kind"] == "timeout"
    assert f"timed out after {spec.budget.trial_timeout_s:g} s" in trials[HANGS].user_attrs["fail_reason"]
    assert trials[KILLED].user_attrs["fail_kind"] == "crashed"
    assert "worker died (killed by signal 9)" in trials[KILLED].user_attrs["fail_reason"]
    for v in (32, 64, 128):
        assert trials[v].state == TrialState.COMPLETE and trials[v].user_attrs["class.conv.e2e_s.p99"] > 0
    assert "trials 6/6 done (3 failed)" in progress.getvalue()


def test_in_process_trials_that_raise_or_hang(tmp_path):
    spec, storage, backend = _study(tmp_path, [RAISES, 32, HANGS, 64])
    result = Tuner(spec, storage=storage, backend=backend, executor=InProcessExecutor(), progress=io.StringIO()).run()
    assert result.finished == 4 and result.failed == 2
    trials = _by_value(storage, spec.name)
    assert trials[RAISES].user_attrs["fail_kind"] == "error"
    assert trials[HANGS].user_attrs["fail_kind"] == "timeout"
    assert trials[HANGS].user_attrs["fail_reason"] == f"timed out after {spec.budget.trial_timeout_s:g} s"
    assert trials[32].state == trials[64].state == TrialState.COMPLETE


def test_invalid_configs_fail_without_a_worker(tmp_path):
    # V0 without chunked prefill refuses a token budget below max_model_len: such a draw fails with vLLM's
    # reason before it reaches a worker, and the study goes on.
    d = spec_dict(flavor="vllm-v0", vllm_version="0.8.5", engine={"max_model_len": 2048},
                  search={"base": "none", "max_num_batched_tokens": [1024, 4096]}, budget={"trials": 2})
    d["workload"]["max_requests"] = 60
    spec = StudySpec.from_dict(d)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(prepare(spec), storage)
    study.enqueue_trial({"max_num_batched_tokens": 1024})
    study.enqueue_trial({"max_num_batched_tokens": 4096})
    result = Tuner(spec, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()
    assert result.failed == 1 and result.complete == 1
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    bad = next(t for t in trials if t.params["max_num_batched_tokens"] == 1024)
    assert bad.user_attrs["fail_kind"] == "error"
    assert bad.user_attrs["fail_reason"].startswith("invalid config: max_num_batched_tokens")


def test_draws_vllm_would_refuse_are_repaired(tmp_path):
    # Every vLLM refuses max_num_batched_tokens < max_num_seqs: the searched max_num_seqs is lowered to the budget,
    # so the simulated config is the deployable one, and the trial says so.
    d = spec_dict(search={"base": "none", "max_num_seqs": [64, 1024], "max_num_batched_tokens": [512, 2048]},
                  budget={"trials": 2})
    d["workload"]["max_requests"] = 60
    spec = StudySpec.from_dict(d)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(prepare(spec), storage)
    study.enqueue_trial({"max_num_seqs": 1024, "max_num_batched_tokens": 512})
    study.enqueue_trial({"max_num_seqs": 64, "max_num_batched_tokens": 512})
    result = Tuner(spec, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()
    assert result.complete == 2
    fixed, untouched = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert fixed.user_attrs["knobs"]["max_num_seqs"] == 512
    assert fixed.user_attrs["repaired"].startswith("max_num_seqs 1024 -> 512")
    assert untouched.user_attrs["knobs"]["max_num_seqs"] == 64 and "repaired" not in untouched.user_attrs


def test_draws_with_a_deployment_lever_are_repaired_too(tmp_path):
    # A searched capacity lever (replicas, gpu, router) is not an engine knob: the repair looks at the engine knobs
    # alone and leaves the lever as drawn, so the draw runs repaired rather than failing as an invalid config.
    d = spec_dict(search={"base": "none", "max_num_seqs": [64, 1024], "max_num_batched_tokens": [512, 2048],
                          "replicas": [1, 2]},
                  budget={"trials": 1})
    d["workload"]["max_requests"] = 60
    spec = StudySpec.from_dict(d)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(prepare(spec), storage)
    study.enqueue_trial({"max_num_seqs": 1024, "max_num_batched_tokens": 512, "replicas": 2})
    result = Tuner(spec, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()
    (trial,) = optuna.load_study(study_name=spec.name, storage=storage).trials
    assert result.complete == 1, trial.user_attrs.get("fail_reason")
    assert trial.user_attrs["knobs"]["max_num_seqs"] == 512 and trial.user_attrs["knobs"]["replicas"] == 2
    assert trial.user_attrs["repaired"].startswith("max_num_seqs 1024 -> 512")


class ColdBackend(TrialBackend):
    """Test-only: a backend that takes 3 s to arrive on a worker (unpickling), then runs 0.2 s, reporting the
    worker's niceness."""

    name = "cold"

    def __setstate__(self, state):
        time.sleep(3.0)
        self.__dict__.update(state)

    def run(self, params, seeds):
        time.sleep(0.2)
        return {"nice": float(os.getpriority(os.PRIO_PROCESS, 0)), "pid": float(os.getpid())}


def test_ray_timeout_counts_the_trial_not_the_workers_start(local_ray):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    executor = RayExecutor(workers=2)
    executor.start()
    try:
        backend = ColdBackend()
        # 2 s limit; each worker first spends 3 s receiving the backend: counted from the submit, both would
        # time out, counted from the trial's own start they finish.
        executor.submit(0, backend, {}, [0], timeout_s=2.0)
        executor.submit(1, backend, {}, [0], timeout_s=2.0)
        outcomes = []
        while len(outcomes) < 2:
            outcomes += executor.wait(timeout_s=30)
        assert sorted(o.kind for o in outcomes) == ["ok", "ok"], outcomes
        # Warm workers: the next trials run on the same two processes, with the backend already there.
        first = {o.metrics["pid"] for o in outcomes}
        executor.submit(2, backend, {}, [0], timeout_s=2.0)
        outcomes = []
        while not outcomes:
            outcomes += executor.wait(timeout_s=30)
        assert outcomes[0].ok and outcomes[0].metrics["pid"] in first
        if os.geteuid() == 0 or os.getpriority(os.PRIO_PROCESS, 0) == 0:
            # Not Ray's nice 15, nor nice 0 beside a niced driver: the trial runs at the driver's own niceness.
            assert outcomes[0].metrics["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        executor.shutdown()
