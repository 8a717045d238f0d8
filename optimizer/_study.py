"""Running a study: an Optuna study in its storage, trials asked for and told back as executors finish them.

- The study lives in its storage (SQLite under the out dir by default) under the spec's name; running the same
  command again resumes it.  Trials a killed driver left RUNNING are failed as ``interrupted`` and enqueued again
  with the same parameters; the trial budget counts finished trials (complete, pruned, or failed for a reason of
  their own), so nothing finished is lost or counted twice.
- Each trial stores every metric of its summary as a user attribute (``class.<name>.e2e_s.p99`` ...; the
  prompt-bucket cohorts together under ``prompt_buckets``), its engine ``knobs``, and its ``constraints`` (SLO
  violations, <= 0 is feasible), also set through Optuna's constraint API so that samplers see them.
- A failed trial (it raised, timed out, or its worker died) is told as FAIL with ``fail_reason`` / ``fail_kind``.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from objectives.registry import Constraint, Objective, get_objective, is_bound, parse_bound, slo_constraints
from optimizer._backend import SimBackend, TrialBackend
from optimizer._executors import Executor, RayExecutor, TrialOutcome, code_runtime_env
from optimizer._knobs import params_to_knobs, repair_knobs
from optimizer._progress import ProgressLine
from optimizer._samplers import TRIAL_CONSTRAINTS, make_sampler
from optimizer._spec import IDENTITY_KEYS, StudySpec
from sim.engine.config import EngineConfig
from sim.errors import ConfigError, KvtuneError
from sim.profiles import load_gpu, load_model
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload

FAIL_REASON = "fail_reason"
FAIL_KIND = "fail_kind"
INTERRUPTED = "interrupted"
#: Constraint values above this are stored as this (Optuna rejects NaN; some samplers choke on inf).
MAX_VIOLATION = 1e6
#: Storage "URL" of a study kept in memory (nothing persists).
MEMORY = "memory"
_IDENTITY_ATTR = "kvtune.identity"
_SPEC_ATTR = "kvtune.spec"


@dataclass
class StudyContext:
    """What running and exporting a study both need: the built workloads, classes, objectives, constraints."""

    spec: StudySpec
    workloads: dict[int, Workload]
    classes: dict[str, RequestClass]
    objectives: list[Objective]
    constraints: list[Constraint]

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def seeds(self) -> list[int]:
        return list(self.workloads)


def prepare(spec: StudySpec) -> StudyContext:
    """Build the workload of every replicate seed and resolve objectives and constraints against its classes."""
    workloads = {seed: spec.workload.build(seed) for seed in spec.replicate_seeds()}
    classes = dict(next(iter(workloads.values())).classes)
    objectives = []
    for i, name in enumerate(spec.objectives):
        try:
            objectives.append(get_objective(name, classes))
        except ConfigError as exc:
            raise ConfigError(f"objectives[{i}]", str(exc)[len(exc.field) + 2:]) from None
    bounds = []
    if spec.constraints == "none":
        selected: dict[str, RequestClass] = {}
    elif spec.constraints == "slo":
        selected = classes
    else:
        for i, item in enumerate(spec.constraints):
            if is_bound(item):
                try:
                    bounds.append(parse_bound(item, classes))
                except ConfigError as exc:
                    raise ConfigError(f"constraints[{i}]", str(exc)[len(exc.field) + 2:]) from None
        names = [c for c in spec.constraints if not is_bound(c)]
        if "slo" in names:
            names = [n for n in names if n != "slo"] + [n for n in classes if n not in names]
        unknown = [c for c in names if c not in classes]
        if unknown:
            raise ConfigError("constraints", f"names classes the workload does not have: {unknown}; "
                                             f"classes: {sorted(classes)}")
        selected = {name: classes[name] for name in names}
        no_slo = [name for name, cls in selected.items() if not cls.slo.targets() and name in spec.constraints]
        if no_slo:
            raise ConfigError("constraints", f"classes {no_slo} have no SLO (workload.classes.<name>.slo)")
    return StudyContext(spec, workloads, classes, objectives, slo_constraints(selected) + bounds)


# ---- storage ---------------------------------------------------------------------------------------------------
def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if str(path) not in ("", ":memory:"):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError("storage", f"cannot create {path.parent} for {url}: {exc.strerror or exc}") from None


def make_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (``memory``: in this process only, for benchmarks and notebooks).  SQLite files
    get WAL journaling with ``synchronous=NORMAL``: a trial stores dozens of user attributes, each its own commit,
    and a full fsync per commit would dominate short trials."""
    if url == MEMORY:
        return optuna.storages.InMemoryStorage()
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return url
    import sqlalchemy

    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})

    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", _pragmas)
    storage.engine.dispose()  # connections opened while creating the schema lack the pragmas
    return storage


def open_study(ctx: StudyContext, storage: str, sampler: optuna.samplers.BaseSampler | None = None, *,
               create: bool = True) -> optuna.Study:
    """The spec's study in ``storage`` (created if ``create``); a stored study made from a different spec (other
    workload, space, objectives...) is refused, naming what differs."""
    spec = ctx.spec
    _ensure_sqlite_dir(storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        backend = make_storage(storage)
        if create:
            study = optuna.create_study(storage=backend, sampler=sampler, study_name=spec.name,
                                        directions=ctx.directions, load_if_exists=True)
        else:
            study = optuna.load_study(study_name=spec.name, storage=backend, sampler=sampler)
    except KeyError:
        raise ConfigError("storage", f"no study named {spec.name!r} in {storage}; run 'kvtune tune' first") from None
    except (ValueError, ImportError, SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("storage", f"cannot open {storage}: {first}") from None
    stored = [d.name.lower() for d in study.directions]
    if stored != ctx.directions:
        raise ConfigError("objectives", f"study {spec.name!r} in {storage} optimizes {stored}, this spec "
                                        f"{ctx.directions}; use another study name or storage")
    identity = spec.identity()
    previous = study.user_attrs.get(_IDENTITY_ATTR)
    if previous is None:
        if create:
            study.set_user_attr(_IDENTITY_ATTR, identity)
            study.set_user_attr(_SPEC_ATTR, json.loads(json.dumps(spec.to_dict(), default=str)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(spec.objectives))
    elif previous != identity:
        changed = [key for key in IDENTITY_KEYS if previous.get(key) != identity.get(key)]
        raise ConfigError(changed[0] if changed else "spec",
                          f"study {spec.name!r} in {storage} was made from a spec with a different "
                          f"{', '.join(changed) or 'content'}; its trials would not compare. Use another study "
                          f"name (name:) or storage (--storage), or restore the spec")
    return study


def _set_trial_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    # Optuna has no public setter for a trial this process did not ask for (one a dead driver left RUNNING).
    study._storage.set_trial_user_attr(trial._trial_id, key, value)  # noqa: SLF001


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Fail the trials a killed driver left RUNNING (``interrupted``) and enqueue their params again."""
    trials = study.get_trials(deepcopy=False)
    waiting = [t.params for t in trials if t.state == TrialState.WAITING]
    recovered = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        _set_trial_user_attr(study, t, FAIL_REASON, "interrupted: the driver stopped while this trial ran; re-enqueued")
        _set_trial_user_attr(study, t, FAIL_KIND, INTERRUPTED)
        study.tell(t.number, state=TrialState.FAIL)
        if t.params and t.params not in waiting:
            study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            waiting.append(t.params)
        recovered.append(t.number)
    return recovered


def is_finished(t: FrozenTrial) -> bool:
    """Counts against the trial budget: complete, pruned, or failed for a reason other than an interruption."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and t.user_attrs.get(FAIL_KIND) != INTERRUPTED


def is_feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in t.user_attrs.get("constraints", ()))


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


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if hasattr(value, "item"):
        return value.item()
    return value


class Tuner:
    """Runs (or resumes) a study until it has ``trials`` finished trials.

    ``backend``: default per the spec's ``backend:`` -- :class:`SimBackend` on the spec's workload, or for
    ``kind: replay`` a :class:`replay.ReplayBackend` (imported only then) launching vLLM or the twin per trial, or
    replaying against ``url``.  ``executor``: default :class:`RayExecutor` (``address`` or the spec's
    ``ray_address``; ``workers`` trials at once, default one per CPU, and per ``backend.gpus_per_trial`` GPUs:
    each trial reserves them as a Ray resource).  With ``backend.url`` trials run one at a time (``workers`` 1).
    """

    def __init__(self, spec: StudySpec, *, trials: int | None = None, workers: int | None = None,
                 storage: str | None = None, address: str | None = None, out: str | Path | None = None,
                 backend: TrialBackend | None = None, executor: Executor | None = None,
                 trial_timeout_s: float | None = None, progress: TextIO | None = None,
                 context: StudyContext | None = None):
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
        self.out = spec.out_dir(out)
        self.storage = spec.storage_url(storage, self.out)
        self.address = address or spec.ray_address
        self.backend = backend
        self.executor = executor
        self.timeout_s = trial_timeout_s if trial_timeout_s is not None else spec.budget.trial_timeout_s
        self.progress_stream = progress if progress is not None else sys.stderr
        self.ctx = context
        #: The Optuna study, once :meth:`run` opened it.
        self.study: optuna.Study | None = None
        self._model_max_len = load_model(spec.model).max_model_len
        self._device = load_gpu(spec.gpu)

    # ------------------------------------------------------------------------------------------------------------
    def run(self) -> StudyResult:
        t0 = time.monotonic()
        spec = self.spec
        ctx = self.ctx or prepare(spec)
        self.ctx = ctx
        backend = self.backend or self.make_backend(ctx)
        backend.prepare(ctx.seeds)
        sampler = make_sampler(spec.sampler, spec.search, constrained=bool(ctx.constraints))
        target = self.target
        grid = spec.sampler.name == "grid"
        if grid:
            target = min(target, spec.search.grid_size())
        study = open_study(ctx, self.storage, sampler)
        self.study = study
        recovered = recover_interrupted(study)
        trials = study.get_trials(deepcopy=False)
        finished = sum(1 for t in trials if is_finished(t))
        progress = ProgressLine(target, list(spec.objectives), ctx.directions, stream=self.progress_stream,
                                start_done=finished)
        progress.failed = sum(1 for t in trials if t.state == TrialState.FAIL and is_finished(t))
        for t in trials:
            if is_feasible(t):
                progress.observe_feasible(t.values)
        if recovered:
            progress.message(f"kvtune: resumed study {spec.name!r}: trials {recovered} were interrupted and are "
                             f"enqueued again")
        ran = 0
        if finished < target:
            executor = self.executor or RayExecutor(
                self.address, workers=self.workers, runtime_env=code_runtime_env() if self.address else None,
                gpus_per_trial=spec.backend.gpus_per_trial)
            inflight: dict[int, tuple[optuna.Trial, dict[str, Any]]] = {}
            try:
                executor.start()
                capacity = min(executor.capacity, self.workers) if self.workers else executor.capacity
                if self.workers_note:
                    progress.message(self.workers_note)
                if self.backend is None and spec.backend.is_replay and spec.backend.url is None:
                    progress.message(f"kvtune: backend replay: {spec.backend.engine} launched per trial "
                                     f"(speed {spec.backend.speed:g}, {spec.backend.gpus_per_trial:g} GPUs per "
                                     f"trial); results under {self.out / 'replays'}")
                progress.message(f"kvtune: study {spec.name!r}: {finished}/{target} trials finished; running up to "
                                 f"{capacity} at once on {executor.describe()}; storage {self.storage}")
                while True:
                    while len(inflight) < capacity and finished + len(inflight) < target:
                        trial = study.ask()
                        params = spec.search.suggest(trial, all_knobs=grid)
                        knobs = {**spec.fixed_knobs(), **params_to_knobs(params, spec.flavor)}
                        knobs, repaired = repair_knobs(knobs, params, self._model_max_len, self._device)
                        if repaired:
                            trial.set_user_attr("repaired", repaired)
                        problem = self._check_config(knobs)
                        if problem is not None:
                            self._tell(study, trial, knobs, TrialOutcome(trial.number, None, "error", problem),
                                       progress)
                            finished += 1
                            ran += 1
                            continue
                        executor.submit(trial.number, backend, knobs, ctx.seeds, self.timeout_s)
                        inflight[trial.number] = (trial, knobs)
                    progress.running = len(inflight)
                    progress.done = finished
                    progress.update()
                    if not inflight:
                        break
                    for outcome in executor.wait(timeout_s=1.0):
                        entry = inflight.pop(outcome.number, None)
                        if entry is None:
                            continue
                        trial, knobs = entry
                        self._tell(study, trial, knobs, outcome, progress)
                        finished += 1
                        ran += 1
                        progress.done = finished
                        progress.running = len(inflight)
            finally:
                executor.shutdown()
                progress.running = 0
                progress.done = finished
                progress.close()
        trials = study.get_trials(deepcopy=False)
        return StudyResult(
            name=spec.name, storage=self.storage, target=target,
            finished=sum(1 for t in trials if is_finished(t)),
            complete=sum(1 for t in trials if t.state == TrialState.COMPLETE),
            failed=sum(1 for t in trials if t.state == TrialState.FAIL and is_finished(t)),
            feasible=sum(1 for t in trials if is_feasible(t)),
            ran=ran, wall_s=time.monotonic() - t0, recovered=recovered,
        )

    def make_backend(self, ctx: StudyContext) -> TrialBackend:
        """The spec's backend on the built workloads: SimBackend, or a ReplayBackend (results under
        ``<out>/replays``) for ``backend: {kind: replay}``."""
        spec, b = self.spec, self.spec.backend
        if not b.is_replay:
            return SimBackend(ctx.workloads, spec.model, spec.gpu)
        from optimizer._export import hf_model_id
        from replay.backend import ReplayBackend  # aiohttp & co.: only studies that replay need them

        if b.engine == "twin":
            served = spec.model  # the twin simulates the spec's model profile
        else:
            served = b.model or hf_model_id(spec.model)
        kwargs: dict[str, Any] = {}
        if b.startup_timeout_s is not None:
            kwargs["startup_timeout_s"] = b.startup_timeout_s
        if b.twin_slack_ms is not None:
            kwargs["twin_slack_ms"] = b.twin_slack_ms
        return ReplayBackend(ctx.workloads, model=served, gpu=spec.gpu, sim_model=spec.model, url=b.url,
                             engine=b.engine or "vllm", base_config=spec.fixed_knobs(),
                             vllm_version=str(spec.vllm_version), speed=b.speed, out_dir=self.out / "replays",
                             **kwargs)

    def _check_config(self, knobs: Mapping[str, Any]) -> str | None:
        try:
            config = EngineConfig.from_dict(dict(knobs), "knobs").resolve(self._model_max_len, self._device)
        except ConfigError as exc:
            return f"invalid config: {exc}"
        if config.max_num_batched_tokens < config.max_num_seqs:
            return (f"invalid config: max_num_batched_tokens {config.max_num_batched_tokens} < max_num_seqs "
                    f"{config.max_num_seqs} (vLLM refuses this)")
        return None

    def _tell(self, study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], outcome: TrialOutcome,
              progress: ProgressLine) -> None:
        ctx = self.ctx
        assert ctx is not None
        trial.set_user_attr("knobs", {k: _jsonable(v) for k, v in knobs.items()})
        trial.set_user_attr("wall_s", round(outcome.wall_s, 3))
        if outcome.ok:
            metrics = outcome.metrics or {}
            try:
                values = [float(o.value(metrics)) for o in ctx.objectives]
                bad = [o.name for o, v in zip(ctx.objectives, values) if math.isnan(v)]
                if bad:
                    raise KvtuneError(f"objective {bad[0]} is NaN (the run cannot tell it)")
                violations = [min(float(c.violation(metrics)), MAX_VIOLATION) for c in ctx.constraints]
            except KvtuneError as exc:
                outcome = TrialOutcome(outcome.number, None, "error", f"no result: {exc}", outcome.wall_s)
            else:
                prompt = {}
                for key, value in metrics.items():
                    if key.startswith("prompt."):
                        prompt[key[len("prompt."):]] = _jsonable(value)
                    else:
                        trial.set_user_attr(key, _jsonable(value))
                if prompt:
                    trial.set_user_attr("prompt_buckets", prompt)
                trial.set_user_attr("constraints", violations)
                trial.set_user_attr("constraint_names", [c.name for c in ctx.constraints])
                feasible = all(v <= 0 for v in violations)
                trial.set_user_attr("feasible", feasible)
                if TRIAL_CONSTRAINTS:
                    for c, v in zip(ctx.constraints, violations):
                        trial.set_constraint(c.name, v)
                _tell(study, trial, values)
                if feasible:
                    progress.observe_feasible(values)
                return
        trial.set_user_attr(FAIL_REASON, outcome.reason or outcome.kind)
        trial.set_user_attr(FAIL_KIND, outcome.kind)
        _tell(study, trial, state=TrialState.FAIL)
        progress.failed += 1
        progress.message(f"kvtune: trial {outcome.number} failed ({outcome.kind}): {outcome.reason}")


def _tell(study: optuna.Study, trial: Any, values: Sequence[float] | None = None,
          state: TrialState | None = None) -> None:
    """``study.tell``; Optuna's grid sampler calls ``study.stop()`` after the last grid point, which raises outside
    ``optimize`` -- the trial is stored by then (Optuna stores it in a ``finally``), so that error is dropped."""
    try:
        study.tell(trial, values, state=state)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def run_study(spec: StudySpec, **kwargs: Any) -> StudyResult:
    """``Tuner(spec, **kwargs).run()``."""
    return Tuner(spec, **kwargs).run()
