"""Running a study: an Optuna study in its storage, trials asked for and told back as executors finish them.

- The study lives in its storage (SQLite under the out dir by default) under the spec's name; running the same
  command again resumes it.  Trials a killed driver left RUNNING are failed as ``interrupted`` and enqueued again
  with the same parameters; the trial budget counts finished trials (complete, pruned, or failed for a reason of
  their own), so nothing finished is lost or counted twice.
- Each trial stores every metric of its summary as user attributes (``class.<name>.e2e_s.p99`` ... one attribute
  each; each bucket-cohort family as one dict: ``prompt_buckets``, ``output_buckets``, ``preempted_buckets``, see
  ``optimizer._storage.metric_attrs``; read them back flat with ``trial_metrics``), its engine ``knobs``, and its
  ``constraints`` (SLO violations, <= 0 is feasible), also set through Optuna's constraint API so that samplers see
  them.
- A failed trial (it raised, timed out, or its worker died) is told as FAIL with ``fail_reason`` / ``fail_kind``.
- The target vLLM's default config (the spec's fixed knobs, nothing searched; every replicate seed) is one of the
  study's trials, the first one a fresh study runs, marked ``kvtune_default`` (``optimizer._storage.DEFAULT_ATTR``)
  and counted in the trial budget (a grid study runs every grid point and the default).  The export compares every
  candidate with it.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from optimizer._backend import SimBackend, TrialBackend, backend_factory
from optimizer._executors import (
    Executor,
    InProcessExecutor,
    ProcessExecutor,
    RayExecutor,
    TrialOutcome,
    check_reachable,
    choose_executor,
    code_runtime_env,
)
from optimizer._capacity import fleet_problem, priced, startup_problem
from optimizer._knobs import params_to_knobs, repair_knobs, split_deployment
from optimizer._progress import Phases, ProgressLine
from optimizer._samplers import TRIAL_CONSTRAINTS, make_sampler
from optimizer._spec import StudySpec
from optimizer._storage import (
    FAIL_KIND,
    FAIL_REASON,
    HEARTBEAT_INTERVAL_S,
    INTERRUPTED,
    MEMORY,
    PRUNE_REASON,
    StudyContext,
    claim_start,
    driver_identity,
    ensure_default_trial,
    heartbeat_enabled,
    is_default,
    is_feasible,
    is_finished,
    mark_driver,
    metric_attrs,
    open_study,
    prepare,
    recover_interrupted,
    requeue,
    set_user_attrs,
    storage_lock,
)
from sim.engine.config import EngineConfig
from sim.errors import ConfigError, KvtuneError
from sim.profiles import load_gpu, load_model

#: Constraint values above this are stored as this (Optuna rejects NaN; some samplers choke on inf).
MAX_VIOLATION = 1e6
#: Times a config whose worker died (``crashed``) is run again, and how many crashes in a row stop the study.
CRASH_RETRIES = 2
MAX_CONSECUTIVE_CRASHES = 6

__all__ = ["FAIL_KIND", "FAIL_REASON", "INTERRUPTED", "MEMORY", "StudyContext", "StudyResult", "Tuner",
           "is_feasible", "is_finished", "open_study", "prepare", "recover_interrupted", "run_study"]


# ---- running ---------------------------------------------------------------------------------------------------
@dataclass
class StudyResult:
    """What a run left in storage."""

    name: str
    storage: str
    target: int
    finished: int
    complete: int
    failed: int
    feasible: int
    ran: int
    wall_s: float
    recovered: list[int] = field(default_factory=list)
    #: Wall seconds by phase of the driver (:class:`~optimizer._progress.Phases`).
    phases: dict[str, float] = field(default_factory=dict)
    #: The executor the trials ran on (``ray``, ``process``, ``in-process``, or the class name of one passed in;
    #: None when nothing was left to run) and why it was chosen.
    executor: str | None = None
    executor_reason: str | None = None

    @property
    def split(self) -> dict[str, float]:
        """:attr:`wall_s` in four parts that sum to it: ``start`` (building the workloads, opening the storage,
        starting the executor), ``storage`` (asking the sampler for trials and storing their results), ``shutdown``
        (stopping the executor), and ``trials`` (the rest: trials running, and what the driver does between)."""
        return split_wall(self.wall_s, self.phases)

    def split_text(self) -> str:
        """``start 0.4 s, trials 5.1 s, storage 0.9 s, shutdown 0.0 s``."""
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.split.items())

    def to_dict(self) -> dict[str, Any]:
        """What ``kvtune tune`` writes to ``<out>/study_run.json``."""
        return {"name": self.name, "storage": self.storage, "target": self.target, "finished": self.finished,
                "complete": self.complete, "failed": self.failed, "feasible": self.feasible, "ran": self.ran,
                "recovered": list(self.recovered), "executor": self.executor, "executor_reason": self.executor_reason,
                "wall_s": round(self.wall_s, 3), "split_s": {k: round(v, 3) for k, v in self.split.items()},
                "phases_s": {k: round(v, 3) for k, v in self.phases.items()}}


#: Driver phases (:class:`~optimizer._progress.Phases`) in each part of :attr:`StudyResult.split`; ``trials`` is the
#: rest of the wall time.
SPLIT_PHASES = {"start": ("prepare", "storage", "executor_start"), "storage": ("ask", "tell"),
                "shutdown": ("shutdown",)}


def split_wall(wall_s: float, phases: Mapping[str, float]) -> dict[str, float]:
    """``wall_s`` as ``start``, ``trials``, ``storage``, ``shutdown`` (see :attr:`StudyResult.split`)."""
    parts = {name: sum(phases.get(k, 0.0) for k in keys) for name, keys in SPLIT_PHASES.items()}
    trials = max(0.0, wall_s - sum(parts.values()))
    return {"start": parts["start"], "trials": trials, "storage": parts["storage"], "shutdown": parts["shutdown"]}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if hasattr(value, "item"):
        return value.item()
    return value


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

    def _check_config(self, knobs: Mapping[str, Any]) -> tuple[str, str] | None:
        """``("error", why)`` for a config vLLM refuses, ``("pruned", why)`` for a deployment that cannot start
        (optimizer._capacity.startup_problem), None for a config to run."""
        engine, _ = split_deployment(knobs)
        try:
            config = EngineConfig.from_dict(engine, "knobs").resolve(self._model_max_len, self._device_of(knobs))
        except ConfigError as exc:
            return "error", f"invalid config: {exc}"
        if config.max_num_batched_tokens < config.max_num_seqs:
            return "error", (f"invalid config: max_num_batched_tokens {config.max_num_batched_tokens} < max_num_seqs "
                             f"{config.max_num_seqs} (vLLM refuses this)")
        problem = fleet_problem(knobs)
        if problem is not None:
            return "error", problem
        if self._capacity_searched:
            problem = startup_problem(knobs, self.spec.model, self.spec.gpu)
            if problem is not None:
                return "pruned", problem
        return None

    def _prune(self, study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], reason: str,
               progress: ProgressLine) -> None:
        """A capacity-lever combination that cannot start: PRUNED with its reason (counted in the budget)."""
        set_user_attrs(trial, {"knobs": {k: _jsonable(v) for k, v in knobs.items()}, PRUNE_REASON: reason})
        _tell(study, trial, state=TrialState.PRUNED)
        progress.message(f"kvtune: trial {trial.number} pruned: {reason}")

    def _tell(self, study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], outcome: TrialOutcome,
              progress: ProgressLine) -> None:
        try:
            self._tell_outcome(study, trial, knobs, outcome, progress)
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another driver took the trial for an orphan (its heartbeat went stale) and re-enqueued it.
            progress.message(f"kvtune: trial {trial.number} was failed by another driver meanwhile (stale "
                             f"heartbeat); its result is dropped, its config runs again")

    def _copy_result(self, study: optuna.Study, trial: optuna.Trial, source: FrozenTrial,
                     progress: ProgressLine) -> None:
        """Tell ``trial`` the stored result of ``source``, a trial with the same params: the simulator is
        deterministic, so running it again would carry no information."""
        skip = {"retry_of", "crash_attempt", "retried", "duplicate_of"}
        # Wholesale, in the source's layout (bucket cohorts grouped, or flat from an earlier kvtune): trial_metrics
        # reads either.
        attrs = {key: value for key, value in source.user_attrs.items() if key not in skip}
        if source.state == TrialState.COMPLETE and TRIAL_CONSTRAINTS:  # before the metrics (see _tell_outcome)
            for name, v in zip(source.user_attrs.get("constraint_names", ()), source.user_attrs.get("constraints", ())):
                trial.set_constraint(name, v)
        set_user_attrs(trial, {**attrs, "duplicate_of": source.number, "wall_s": 0.0})
        if source.state == TrialState.COMPLETE:
            _tell(study, trial, list(source.values))
            if is_feasible(source):
                progress.observe_feasible(source.values)
        else:
            _tell(study, trial, state=TrialState.FAIL)
            progress.failed += 1
        progress.message(f"kvtune: trial {trial.number} drew the config of trial {source.number}; its result is "
                         f"reused, not simulated again")

    def _interrupt(self, study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
        """Fail ``trial`` as ``interrupted`` (not counted against the budget) and enqueue its params again."""
        set_user_attrs(trial, {FAIL_REASON: f"interrupted: {reason}", FAIL_KIND: INTERRUPTED})
        _tell(study, trial, state=TrialState.FAIL)
        if trial.params or is_default(trial):
            requeue(study, trial, {"retry_of": trial.number})

    def _tell_outcome(self, study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any],
                      outcome: TrialOutcome, progress: ProgressLine) -> None:
        ctx = self.ctx
        assert ctx is not None
        # Written together (one transaction): a trial stores hundreds of metrics.
        attrs: dict[str, Any] = {"knobs": {k: _jsonable(v) for k, v in knobs.items()},
                                 "wall_s": round(outcome.wall_s, 3)}
        if outcome.ok:
            metrics = priced(outcome.metrics or {}, knobs, self.spec.gpu)  # the deployment's price, for cost objectives
            try:
                values = [float(o.value(metrics)) for o in ctx.objectives]
                bad = [o.name for o, v in zip(ctx.objectives, values) if math.isnan(v)]
                if bad:
                    raise KvtuneError(f"objective {bad[0]} is NaN (the run cannot tell it)")
                violations = [min(float(c.violation(metrics)), MAX_VIOLATION) for c in ctx.constraints]
            except KvtuneError as exc:
                outcome = TrialOutcome(outcome.number, None, "error", f"no result: {exc}", outcome.wall_s)
            else:
                # The bucket cohorts grouped, one attribute per family (metric_attrs; trial_metrics reads them).
                attrs.update(metric_attrs({key: _jsonable(value) for key, value in metrics.items()}))
                feasible = all(v <= 0 for v in violations)
                attrs.update(constraints=violations, constraint_names=[c.name for c in ctx.constraints],
                             feasible=feasible)
                if TRIAL_CONSTRAINTS:  # before the metrics: each call reads the whole trial back
                    for c, v in zip(ctx.constraints, violations):
                        trial.set_constraint(c.name, v)
                set_user_attrs(trial, attrs)
                _tell(study, trial, values)
                if feasible:
                    progress.observe_feasible(values)
                return
        set_user_attrs(trial, {**attrs, FAIL_REASON: outcome.reason or outcome.kind, FAIL_KIND: outcome.kind})
        _tell(study, trial, state=TrialState.FAIL)
        progress.failed += 1
        progress.message(f"kvtune: trial {outcome.number} failed ({outcome.kind}): {outcome.reason}")


class StudyStopped(KvtuneError):
    """The study stopped itself (e.g. too many trials in a row lost their workers); the storage keeps what ran."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as gracefully as Ctrl-C (SIGINT)."""


@contextlib.contextmanager
def _graceful_sigterm():
    """While the study runs, SIGTERM raises :class:`Terminated` in the main thread (instead of ``ray.init``'s
    handler, which exits from wherever the driver is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum, frame):  # noqa: ARG001
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _trial_key(t: Any) -> str | None:
    """What identifies a trial's config for reuse: its params, or the default config's mark (it has no params);
    None for a trial with neither (nothing to reuse)."""
    if is_default(t):
        return "kvtune_default"
    return _params_key(t.params) if t.params else None


def _params_key(params: Mapping[str, Any]) -> str:
    return json.dumps({k: _jsonable(v) for k, v in params.items()}, sort_keys=True, default=str)


#: Failure kinds that a config always reproduces (the simulator is deterministic): never worth running again.
_DETERMINISTIC_FAILS = ("error",)


class _Run:
    """One driver's pass over a study: asks for trials while the stored study (every driver's trials) is short of
    the target, submits them, tells their outcomes, keeps their heartbeats, never simulates a config the storage
    already holds a result for, retries crashed ones a bounded number of times."""

    def __init__(self, tuner: "Tuner", study: optuna.Study, executor: Executor, backend: TrialBackend,
                 progress: ProgressLine, grid: bool, target: int):
        self.tuner, self.study, self.executor, self.backend = tuner, study, executor, backend
        self.progress, self.grid, self.target = progress, grid, target
        self.inflight: dict[int, tuple[optuna.Trial, dict[str, Any]]] = {}
        #: A trial asked while every worker was busy (``Executor.asks_ahead``), submitted as soon as one frees:
        #: the worker then waits for a submit, not for Optuna's tell and ask.
        self.ahead: tuple[optuna.Trial, dict[str, Any]] | None = None
        self.capacity = 1  # trials at once (set by loop)
        #: Trials that drew the params of a trial in flight: told its outcome when it ends (number -> trials).
        self.followers: dict[int, list[tuple[optuna.Trial, dict[str, Any]]]] = {}
        #: Trials that drew the params of a trial another driver runs: told its result once it is stored.
        self.remote_followers: list[tuple[optuna.Trial, dict[str, Any], int]] = []
        self.elsewhere: dict[str, int] = {}
        self.consecutive_crashes = 0
        self.driver = driver_identity()
        self.finished = 0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._last_recovery = time.monotonic()

    # ---- bookkeeping ---------------------------------------------------------------------------------------------
    def _stored(self) -> tuple[int, int, dict[str, FrozenTrial]]:
        """(finished, running, {params: the trial whose result a repeat of them copies}) over every driver; also
        refreshes :attr:`elsewhere` (params of trials other drivers run now -> trial number)."""
        finished = running = 0
        done: dict[str, FrozenTrial] = {}
        self.elsewhere = {}
        mine = (set(self.inflight) | {t.number for t, _ in self._ahead()}
                | {t.number for fs in self.followers.values() for t, _ in fs}
                | {t.number for t, _, _ in self.remote_followers})
        for t in self.study.get_trials(deepcopy=False):
            if is_finished(t):
                finished += 1
            elif t.state == TrialState.RUNNING:
                running += 1
                if _trial_key(t) is not None and t.number not in mine:
                    self.elsewhere.setdefault(_trial_key(t), t.number)
            if _trial_key(t) is not None and (t.state == TrialState.COMPLETE or (
                    t.state == TrialState.FAIL and t.user_attrs.get(FAIL_KIND) in _DETERMINISTIC_FAILS)):
                done.setdefault(_trial_key(t), t)
        return finished, running, done

    def _start_heartbeat(self) -> None:
        if self._heartbeat is not None or not heartbeat_enabled(self.study):
            return
        storage = self.study._storage  # noqa: SLF001

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_INTERVAL_S):
                beating = (list(self.inflight.values()) + self._ahead()
                           + [f for fs in list(self.followers.values()) for f in fs]
                           + [(t, k) for t, k, _ in list(self.remote_followers)])
                for trial, _ in beating:
                    try:
                        storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
                    except Exception:  # a busy database: the next beat comes within the grace period
                        pass

        self._heartbeat = threading.Thread(target=beat, name="kvtune-heartbeat", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Heartbeat ... supposed to be used with Study.optimize": ask/tell here
            trial = self.study.ask()
        mark_driver(self.study, trial, self.driver)
        if heartbeat_enabled(self.study):
            self.study._storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
        return trial

    # ---- the loop ------------------------------------------------------------------------------------------------
    def loop(self) -> None:
        tuner, spec, study, progress = self.tuner, self.tuner.spec, self.study, self.progress
        phases = tuner.phases
        ctx = tuner.ctx
        assert ctx is not None
        capacity = self.capacity = (min(self.executor.capacity, tuner.workers) if tuner.workers
                                    else self.executor.capacity)
        ask_ahead = self.executor.asks_ahead
        if tuner.workers_note:
            progress.message(tuner.workers_note)
        if tuner.backend is None and spec.backend.is_replay and spec.backend.url is None:
            progress.message(f"kvtune: backend replay: {spec.backend.engine} launched per trial "
                             f"(speed {spec.backend.speed:g}, {spec.backend.gpus_per_trial:g} GPUs per "
                             f"trial); results under {tuner.out / 'replays'}")
        self.finished, running, done = self._stored()
        others = running - len(self.inflight)
        progress.message(f"kvtune: study {spec.name!r}: {self.finished}/{self.target} trials finished"
                         + (f", {others} running in another driver" if others else "")
                         + f"; running up to {capacity} at once on {self.executor.describe()}; storage {tuner.storage}")
        if tuner.executor_choice is not None and tuner.executor_choice[1] != "given":
            kind, why = tuner.executor_choice
            progress.message(f"kvtune: executor {kind}: {why} (--executor or the spec's executor: to force one of "
                             f"ray, process, in-process)")
        self._start_heartbeat()
        while True:
            if time.monotonic() - self._last_recovery > HEARTBEAT_INTERVAL_S:
                self._last_recovery = time.monotonic()
                recovered = recover_interrupted(study)
                if recovered:
                    progress.message(f"kvtune: trials {recovered} lost their driver and are enqueued again")
            self.finished, running, done = self._stored()
            self._submit_ahead()
            while ((len(self.inflight) < capacity or (ask_ahead and self.ahead is None))
                   and self.finished + running < self.target):
                with phases.time("ask"):
                    trial = self._ask()
                    running += 1
                    if is_default(trial):  # the engine's default config: nothing searched, nothing repaired
                        knobs = spec.fixed_knobs()
                    else:
                        params = spec.search.suggest(trial, all_knobs=self.grid)
                        knobs = {**spec.fixed_knobs(), **params_to_knobs(params, spec.flavor)}
                        knobs, repaired = repair_knobs(knobs, params, tuner._model_max_len, tuner._device_of(knobs))
                        if repaired:
                            trial.set_user_attr("repaired", repaired)
                key = _trial_key(trial) or _params_key(trial.params)
                if key in done:  # the simulator is deterministic: a repeat carries no information
                    tuner._copy_result(study, trial, done[key], progress)
                    self._told()
                    running -= 1
                    continue
                leader = next((t.number for t, _ in list(self.inflight.values()) + self._ahead()
                               if (_trial_key(t) or _params_key(t.params)) == key), None)
                if leader is not None:
                    self.followers.setdefault(leader, []).append((trial, knobs))
                    continue
                if key in self.elsewhere:  # another driver runs this config now: wait for its result
                    self.remote_followers.append((trial, knobs, self.elsewhere[key]))
                    continue
                problem = tuner._check_config(knobs)
                if problem is not None and problem[0] == "pruned":
                    tuner._prune(study, trial, knobs, problem[1], progress)
                    self._told()
                    running -= 1
                    continue
                if problem is not None:
                    tuner._tell(study, trial, knobs, TrialOutcome(trial.number, None, "error", problem[1]), progress)
                    self._told()
                    running -= 1
                    done[key] = study._storage.get_trial(trial._trial_id)  # noqa: SLF001
                    continue
                if len(self.inflight) < capacity:
                    self._submit(trial, knobs)
                else:
                    self.ahead = (trial, knobs)
            progress.running = len(self.inflight)
            progress.done = self.finished
            progress.update()
            self._settle_remote_followers()
            if not self.inflight:
                if not self.remote_followers:
                    break
                time.sleep(1.0)
                continue
            with phases.time("wait"):
                outcomes = self.executor.wait(timeout_s=1.0)
            ended = [(self.inflight.pop(o.number), o) for o in outcomes if o.number in self.inflight]
            self._submit_ahead()  # before telling: the freed worker starts the held trial at once
            for entry, outcome in ended:
                with phases.time("tell"):
                    self._outcome(entry, outcome)

    def _ahead(self) -> list[tuple[optuna.Trial, dict[str, Any]]]:
        return [self.ahead] if self.ahead is not None else []

    def _submit(self, trial: optuna.Trial, knobs: dict[str, Any]) -> None:
        with self.tuner.phases.time("submit"):
            self.executor.submit(trial.number, self.backend, knobs, self.tuner.ctx.seeds, self.tuner.timeout_s)
        self.inflight[trial.number] = (trial, knobs)

    def _submit_ahead(self) -> None:
        if self.ahead is not None and len(self.inflight) < self.capacity:
            trial, knobs = self.ahead
            self.ahead = None
            self._submit(trial, knobs)

    def _settle_remote_followers(self) -> None:
        """Tell each remote follower the result its leader (another driver's trial) stored, once it is stored."""
        waiting = []
        for trial, knobs, number in self.remote_followers:
            source = self.study._storage.get_trial(self.study._storage.get_trial_id_from_study_id_trial_number(  # noqa: SLF001
                self.study._study_id, number))  # noqa: SLF001
            if source.state == TrialState.RUNNING:
                waiting.append((trial, knobs, number))
            elif source.state == TrialState.COMPLETE or source.user_attrs.get(FAIL_KIND) in _DETERMINISTIC_FAILS:
                self.tuner._copy_result(self.study, trial, source, self.progress)
                self._told()
            else:  # it timed out, crashed or was interrupted: this config runs again, as its own trial
                self.tuner._interrupt(self.study, trial, f"the other driver's trial {number} of this config ended "
                                                         f"without a result; re-enqueued")
        self.remote_followers = waiting

    def _told(self) -> None:
        self.finished += 1
        self.tuner._ran += 1
        self.progress.done = self.finished

    def _outcome(self, entry: tuple[optuna.Trial, dict[str, Any]], outcome: TrialOutcome) -> None:
        tuner, study, progress = self.tuner, self.study, self.progress
        trial, knobs = entry
        followers = self.followers.pop(outcome.number, [])
        if outcome.kind == "crashed":
            self.consecutive_crashes += 1
            attempt = int(trial.user_attrs.get("crash_attempt", 0))
            retry = attempt < tuner.crash_retries
            if retry:
                trial.set_user_attr("retried", True)
            tuner._tell(study, trial, knobs, outcome, progress)
            if retry:
                progress.failed -= 1  # not a failure of the study's budget: the config runs again
                requeue(study, trial, {"retry_of": trial.number, "crash_attempt": attempt + 1})
                progress.message(f"kvtune: trial {trial.number} is enqueued again (crash retry {attempt + 1} of "
                                 f"{tuner.crash_retries})")
            else:
                self._told()
            for follower, _ in followers:  # they run again themselves, as their own trials
                tuner._interrupt(study, follower, "its config's trial crashed; re-enqueued")
            if self.consecutive_crashes >= tuner.max_consecutive_crashes:
                raise StudyStopped(f"{self.consecutive_crashes} trials in a row lost their Ray worker (last: "
                                   f"{outcome.reason}); the study stopped instead of spending its budget on a "
                                   f"failing cluster. Check the workers, then run the same command to resume")
            return
        self.consecutive_crashes = 0
        tuner._tell(study, trial, knobs, outcome, progress)
        self._told()
        if followers:
            source = study._storage.get_trial(trial._trial_id)  # noqa: SLF001
            for follower, _ in followers:
                if source.state == TrialState.COMPLETE or outcome.kind in _DETERMINISTIC_FAILS:
                    tuner._copy_result(study, follower, source, progress)
                    self._told()
                else:  # a timeout may not repeat: the follower runs on its own
                    tuner._interrupt(study, follower, f"its config's trial ended ({outcome.kind}); re-enqueued")

    def interrupt_inflight(self, reason: str) -> None:
        """Tell every trial in flight (the one held ahead and each follower too) as ``interrupted`` and enqueue
        it again."""
        entries = (list(self.inflight.values()) + self._ahead()
                   + [f for fs in self.followers.values() for f in fs]
                   + [(t, k) for t, k, _ in self.remote_followers])
        self.inflight.clear()
        self.ahead = None
        self.followers.clear()
        self.remote_followers.clear()
        for trial, _ in entries:
            try:
                self.tuner._interrupt(self.study, trial, f"{reason} while this trial ran; re-enqueued")
            except Exception:  # the storage is gone too: the next driver recovers it as an orphan
                pass


try:  # what Study.tell runs, without its read-back of the told trial (see _tell)
    from optuna.study._tell import _tell_with_warning
except ImportError:  # pragma: no cover - Optuna moved it: the public tell does the same, plus the read-back
    _tell_with_warning = None


def _tell(study: optuna.Study, trial: Any, values: Sequence[float] | None = None,
          state: TrialState | None = None) -> None:
    """``study.tell``; Optuna's grid sampler calls ``study.stop()`` after the last grid point, which raises outside
    ``optimize`` -- the trial is stored by then (Optuna stores it in a ``finally``), so that error is dropped.

    ``Study.tell`` is Optuna's ``_tell_with_warning`` (checks, the sampler's ``after_trial``, the state and values
    stored) followed by a read-back of the finished trial from the storage and a deep copy of it, which it returns.
    A trial carries ~720 user attributes, and nothing here uses the returned copy, so the read-back is skipped: the
    same function stores the same rows.  (``Study.optimize`` calls ``_tell_with_warning`` the same way.)"""
    try:
        if _tell_with_warning is not None:
            _tell_with_warning(study, trial, value_or_values=values, state=state)
        else:  # pragma: no cover
            study.tell(trial, values, state=state)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def run_study(spec: StudySpec, **kwargs: Any) -> StudyResult:
    """``Tuner(spec, **kwargs).run()``."""
    return Tuner(spec, **kwargs).run()
