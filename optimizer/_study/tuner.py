"""Running a study from its spec (:class:`Tuner`): build the context (workloads, objectives, constraints), open
(or resume) the study in its storage, pick the trial backend and the executor, run the loop
(:mod:`~optimizer._study.run_loop`), and say what the run left (:class:`~optimizer._study.result.StudyResult`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Mapping, TextIO

import optuna
from optuna.trial import TrialState

from optimizer._backend import SimBackend, TrialBackend, backend_factory
from optimizer._capacity import fleet_problem, startup_problem
from optimizer._executors import (
    Executor,
    InProcessExecutor,
    ProcessExecutor,
    RayExecutor,
    check_reachable,
    choose_executor,
    code_runtime_env,
)
from optimizer._knobs import split_deployment
from optimizer._progress import Phases, ProgressLine
from optimizer._samplers import make_sampler
from optimizer._spec import StudySpec
from optimizer._storage import (
    StudyContext,
    claim_start,
    ensure_default_trial,
    is_feasible,
    is_finished,
    open_study,
    prepare,
    recover_interrupted,
    storage_lock,
)
from optimizer._study.result import StudyResult
from optimizer._study.run_loop import CRASH_RETRIES, MAX_CONSECUTIVE_CRASHES, Terminated, _graceful_sigterm, _Run
from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.profiles import load_gpu, load_model


class Tuner:
    """Runs (or resumes) a study until it has ``trials`` finished trials.

    ``backend``: default per the spec's ``backend:`` -- :class:`SimBackend` on the spec's workload, or for
    ``kind: replay`` the backend the replay package registers (optimizer._backend.register_backend), launching
    vLLM or the twin per trial, or replaying against ``url``.  ``executor``: an :class:`Executor` to use;
    otherwise the kind ``executor_kind`` names (default: the spec's ``executor``, ``auto``: see
    :func:`~optimizer._executors.choose_executor`): :class:`RayExecutor` (``address`` or the spec's
    ``ray_address``; ``workers`` trials at once, default one per CPU, and per ``backend.gpus_per_trial`` GPUs:
    each trial reserves them as a Ray resource), :class:`ProcessExecutor` (``workers`` forked worker processes,
    default one per CPU) or :class:`InProcessExecutor`.  With ``backend.url`` trials run one at a time
    (``workers`` 1).
    """

    def __init__(self, spec: StudySpec, *, trials: int | None = None, workers: int | None = None,
                 storage: str | None = None, address: str | None = None, out: str | Path | None = None,
                 backend: TrialBackend | None = None, executor: Executor | None = None,
                 trial_timeout_s: float | None = None, progress: TextIO | None = None,
                 context: StudyContext | None = None, crash_retries: int = CRASH_RETRIES,
                 max_consecutive_crashes: int = MAX_CONSECUTIVE_CRASHES, executor_kind: str | None = None):
        self.spec = spec
        self.target = trials if trials is not None else spec.budget.trials
        if self.target < 1:
            raise ConfigError("trials", f"must be >= 1, got {self.target}")
        self.workers = workers if workers is not None else spec.budget.workers
        #: Why ``workers`` was overridden (said in the progress output), if it was.
        self.workers_note: str | None = None
        if spec.backend.is_replay and spec.backend.url is not None:
            # One server: two trials at once would share (and disturb) it.
            asked = f", not {self.workers}" if self.workers not in (None, 1) else ""
            self.workers_note = (f"kvtune: backend.url: trials run one at a time against {spec.backend.url} "
                                 f"(workers forced to 1{asked}); the server keeps the config it was started "
                                 f"with, trials only record their knobs")
            self.workers = 1
        elif spec.backend.is_replay and spec.backend.port is not None:
            asked = f", not {self.workers}" if self.workers not in (None, 1) else ""
            self.workers_note = (f"kvtune: backend.port {spec.backend.port}: trials run one at a time (workers forced "
                                 f"to 1{asked}), each on an engine started on that port")
            self.workers = 1
        self.out = spec.out_dir(out)
        self.storage = spec.storage_url(storage, self.out)
        self.address = address or spec.ray_address
        self.backend = backend
        self.executor = executor
        self.executor_kind = executor_kind or spec.executor
        #: The executor kind :meth:`run` used and why (``StudyResult.executor`` / ``executor_reason``).
        self.executor_choice: tuple[str, str] | None = None
        self.timeout_s = trial_timeout_s if trial_timeout_s is not None else spec.budget.trial_timeout_s
        self.progress_stream = progress if progress is not None else sys.stderr
        self.ctx = context
        self.crash_retries = crash_retries
        self.max_consecutive_crashes = max_consecutive_crashes
        self._ran = 0
        #: Where the last :meth:`run`'s time went.
        self.phases = Phases()
        #: The Optuna study, once :meth:`run` opened it.
        self.study: optuna.Study | None = None
        self._model_max_len = load_model(spec.model).max_model_len
        self._devices: dict[str, Any] = {}
        #: Whether the study searches the deployment (device, TP, precision): then a trial that cannot start is
        #: pruned with its reason (without such levers, the spec's start-up check already refused that study).
        self._capacity_searched = any(n in spec.search.names for n in
                                      ("gpu", "tensor_parallel_size", "kv_cache_dtype", "quantization",
                                       ))

    # ------------------------------------------------------------------------------------------------------------
    def run(self) -> StudyResult:
        t0 = time.monotonic()
        spec = self.spec
        phases = self.phases = Phases()
        if self.address and self.executor is None and self.executor_kind in ("auto", "ray"):
            check_reachable(self.address)  # before any work: ray.init would retry an unreachable one for minutes
        with phases.time("prepare"):
            ctx = self.ctx or prepare(spec)
            self.ctx = ctx
            backend = self.backend or self.make_backend(ctx)
            backend.prepare(ctx.seeds)
        target = self.target
        grid = spec.sampler.name == "grid"
        if grid:  # every grid point, and the default config
            target = min(target, spec.search.grid_size() + 1)
        with phases.time("storage"):
            study = open_study(ctx, self.storage)
            self.study = study
            # Seeded from the spec's seed and the trials already stored: a resumed or extended study draws new
            # configs instead of replaying the first run's draws (the samplers read the stored trials for everything
            # else).  Drivers started at the same instant see the same stored trials: each also counts as its own
            # start.
            stored = len(study.get_trials(deepcopy=False))
            start = claim_start(study, self.storage)
            study.sampler = make_sampler(spec.sampler, spec.search, constrained=bool(ctx.constraints),
                                         seed=(spec.sampler.seed + stored + 7919 * start) % 2**32)
            recovered = recover_interrupted(study)
            trials = study.get_trials(deepcopy=False)
            finished = sum(1 for t in trials if is_finished(t))
            if finished < target:  # the default config runs first (see export); one driver enqueues it
                with storage_lock(self.storage):
                    enqueued = ensure_default_trial(study, target)
                if enqueued:
                    trials = study.get_trials(deepcopy=False)
        executor = None
        if finished < target:  # started before any progress output: an unreachable cluster is one error line
            executor = self.executor or self.make_executor(target - finished)
            if self.executor is not None:
                self.executor_choice = (type(executor).__name__, "given")
            with phases.time("executor_start"):
                executor.start()
        progress = ProgressLine(target, list(spec.objectives), ctx.directions, stream=self.progress_stream,
                                start_done=finished)
        progress.failed = sum(1 for t in trials if t.state == TrialState.FAIL and is_finished(t))
        for t in trials:
            if is_feasible(t):
                progress.observe_feasible(t.values)
        if recovered:
            progress.message(f"kvtune: resumed study {spec.name!r}: trials {recovered} were interrupted and are "
                             f"enqueued again")
        self._ran = 0
        if executor is not None:
            run = _Run(self, study, executor, backend, progress, grid, target)
            try:
                with _graceful_sigterm():
                    run.loop()
            except BaseException as exc:
                reason = ("the driver was stopped (SIGTERM)" if isinstance(exc, Terminated) else
                          "the driver was interrupted" if isinstance(exc, KeyboardInterrupt) else
                          f"the study stopped ({type(exc).__name__})")
                run.interrupt_inflight(reason)
                raise
            finally:
                with phases.time("shutdown"):
                    run.stop_heartbeat()
                    executor.shutdown()
                progress.running = 0
                progress.done = run.finished
                progress.close()
        trials = study.get_trials(deepcopy=False)
        return StudyResult(
            name=spec.name, storage=self.storage, target=target,
            finished=sum(1 for t in trials if is_finished(t)),
            complete=sum(1 for t in trials if t.state == TrialState.COMPLETE),
            failed=sum(1 for t in trials if t.state == TrialState.FAIL and is_finished(t)),
            feasible=sum(1 for t in trials if is_feasible(t)),
            ran=self._ran, wall_s=time.monotonic() - t0, recovered=recovered, phases=dict(phases.seconds),
            executor=self.executor_choice[0] if self.executor_choice else None,
            executor_reason=self.executor_choice[1] if self.executor_choice else None,
        )

    def make_executor(self, trials: int) -> Executor:
        """The executor for ``trials`` more trials, of the kind :attr:`executor_kind` names (``auto``: chosen by
        :func:`~optimizer._executors.choose_executor`); the choice and its reason go to :attr:`executor_choice`."""
        spec = self.spec
        kind, why = choose_executor(self.executor_kind, address=self.address, trials=trials,
                                    replicates=spec.replicates, replay=spec.backend.is_replay)
        self.executor_choice = (kind, why)
        if kind == "in-process":
            return InProcessExecutor()
        if kind == "process":
            return ProcessExecutor(workers=self.workers)
        return RayExecutor(self.address, workers=self.workers, runtime_env=code_runtime_env() if self.address else None,
                           gpus_per_trial=spec.backend.gpus_per_trial)

    def make_backend(self, ctx: StudyContext) -> TrialBackend:
        """The spec's backend on the built workloads: SimBackend, or the factory registered for the backend's
        kind (``replay``: the replay package's, results under ``<out>/replays``)."""
        spec = self.spec
        if not spec.backend.is_replay:
            return SimBackend.for_spec(spec, ctx.workloads)
        return backend_factory(spec.backend.kind)(spec, ctx, self.out)

    def _device_of(self, knobs: Mapping[str, Any]) -> Any:
        """The device a trial's knobs run on (the ``gpu`` lever, else the study's)."""
        ref = knobs.get("gpu") or self.spec.gpu
        if ref not in self._devices:
            self._devices[ref] = load_gpu(ref)
        return self._devices[ref]

    def _check_config(self, knobs: Mapping[str, Any], filled: EngineConfig | None = None) -> tuple[str, str] | None:
        """``("error", why)`` for a config vLLM refuses, ``("pruned", why)`` for a deployment that cannot start
        (optimizer._capacity.startup_problem), None for a config to run.  ``filled``: ``knobs``' engine config with
        its defaults filled in (``repair_knobs`` made it), checked here rather than resolved again."""
        try:  # the start-up rules (max_num_batched_tokens >= max_num_seqs, ...: EngineConfig.check_resolved)
            if filled is None:
                engine, _ = split_deployment(knobs)
                config = EngineConfig.from_dict(engine, "knobs").resolve(self._model_max_len, self._device_of(knobs))
            else:
                config = filled
                config.check_resolved()
        except ConfigError as exc:
            return "error", f"invalid config: {exc}"
        problem = fleet_problem(knobs)
        if problem is not None:
            return "error", problem
        if self._capacity_searched:
            # The config resolved here, sized once (no second resolve, no latency model: only whether it fits).
            problem = startup_problem(knobs, self.spec.model, self.spec.gpu, resolved=config)
            if problem is not None:
                return "pruned", problem
        return None


def run_study(spec: StudySpec, **kwargs: Any) -> StudyResult:
    """``Tuner(spec, **kwargs).run()``."""
    return Tuner(spec, **kwargs).run()
