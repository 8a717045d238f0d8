"""A study in its storage: opening it (its spec's identity checked), the context running and exporting it share,
which stored trials count, and which RUNNING trials are orphans.

- Storage: SQLite under the out dir by default (WAL journaling), any SQLAlchemy URL, or ``memory``.  RDB storages
  get Optuna's heartbeat (``heartbeat_interval`` / ``grace_period``): the driver records one for each trial it
  runs, so a second driver on the same storage leaves those trials alone and only fails trials whose heartbeat is
  stale.  Creating the schema and the study runs under a file lock next to a SQLite file (and is retried on other
  databases), so drivers started at the same instant do not race on ``CREATE TABLE``.
- Trial attributes: a trial stores its flat summary metrics (``Summary.to_dict()``) as user attributes, each
  bucket-cohort family (``prompt.*``, ``output.*``, ``preempted.*``: ``objectives.BUCKET_PREFIXES``) as one dict
  under ``<prefix>_buckets`` keyed without the prefix (:func:`metric_attrs`), every other metric under its own key;
  :func:`trial_metrics` gives the flat metrics back, also of trials stored flat by an earlier kvtune.
- Orphans: a RUNNING trial is an orphan when the driver process that asked for it is gone (same host: its pid
  and start time no longer match a live process) or its heartbeat is older than the grace period.  Orphans are
  failed as ``interrupted`` and enqueued again with the same parameters (:func:`recover_interrupted`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from objectives import BUCKET_PREFIXES
from objectives.registry import Constraint, get_objective, is_bound, parse_bound, slo_constraints
from optimizer._context import StudyContext
from optimizer._spec import IDENTITY_KEYS, StudySpec
from sim.errors import ConfigError
from sim.workload.classes import RequestClass

FAIL_REASON = "fail_reason"
#: Why a trial was pruned (a capacity-lever combination that cannot start: optimizer/_capacity.py).
PRUNE_REASON = "prune_reason"
FAIL_KIND = "fail_kind"
INTERRUPTED = "interrupted"
#: Storage "URL" of a study kept in memory (nothing persists).
MEMORY = "memory"
#: Seconds between the heartbeats a driver records for its running trials, and how old one may get before
#: another driver treats the trial as orphaned (Optuna's ``heartbeat_interval`` / ``grace_period``).
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
#: Trial user attribute marking the trial that runs the target vLLM's default config (the study's fixed knobs and
#: nothing searched): every study evaluates it (:func:`ensure_default_trial`), and the export never recommends a
#: config worse than it.
DEFAULT_ATTR = "kvtune_default"
#: Trial system attribute: the driver process that asked for the trial.
DRIVER_ATTR = "kvtune.driver"
_IDENTITY_ATTR = "kvtune.identity"
_SPEC_ATTR = "kvtune.spec"
_STARTS_ATTR = "kvtune.driver_starts"
#: Bucket-cohort key prefix -> the trial user attribute that holds that family's metrics as one dict.
BUCKET_ATTRS = {prefix: f"{prefix}_buckets" for prefix in BUCKET_PREFIXES}
#: Trial user attributes that are not summary metrics (the grouped bucket families are, once expanded).
NON_METRIC_ATTRS = frozenset({"knobs", "constraints", "constraint_names", "feasible", "wall_s", FAIL_REASON,
                              FAIL_KIND, "retry_of", "duplicate_of", "crash_attempt", "retried", "repaired", DEFAULT_ATTR,
                              PRUNE_REASON,
                              *BUCKET_ATTRS.values()})


def prepare(spec: StudySpec) -> StudyContext:
    """Build the workload of every replicate seed and resolve objectives and constraints against its classes.  An
    objective or SLO constraint on a class that no request of the workload belongs to is refused: as an objective
    every trial would fail, as a constraint it would be met vacuously."""
    workloads = {seed: spec.workload.build(seed) for seed in spec.replicate_seeds()}
    classes = dict(next(iter(workloads.values())).classes)
    present = set()
    for workload in workloads.values():
        present |= set(workload.requests["class"].unique())
    objectives = []
    bounds: list[Constraint] = []
    for i, name in enumerate(spec.objectives):
        try:
            objective = get_objective(name, classes)
        except ConfigError as exc:
            raise ConfigError(f"objectives[{i}]", exc.message) from None
        cls = name.rpartition(":")[2] if ":" in name else None
        if cls is not None and cls in classes and cls not in present:
            raise ConfigError(f"objectives[{i}]", f"{name!r} names class {cls!r}, which no request of the workload "
                                                  f"belongs to (classes with requests: {sorted(present)})")
        objectives.append(objective)
    if spec.constraints == "none":
        selected: dict[str, RequestClass] = {}
    elif spec.constraints == "slo":
        selected = classes
        empty = sorted(name for name, c in classes.items() if c.slo.targets() and name not in present)
        if empty:
            raise ConfigError(f"workload.classes.{empty[0]}.slo",
                              f"class {empty[0]!r} has an SLO but no request of the workload belongs to it; a "
                              f"constraint on it would be met vacuously (fix its match rule or drop the SLO)")
    else:
        for i, item in enumerate(spec.constraints):
            if is_bound(item):
                try:
                    bounds.append(parse_bound(item, classes))
                except ConfigError as exc:
                    raise ConfigError(f"constraints[{i}]", exc.message) from None
                cls = _bound_class(item)
                if cls is not None and cls in classes and cls not in present:
                    raise ConfigError(f"constraints[{i}]", f"{item!r} names class {cls!r}, which no request of the "
                                                           f"workload belongs to; it would be met vacuously")
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
        empty = [name for name in selected if name not in present and selected[name].slo.targets()]
        if empty:
            raise ConfigError("constraints", f"class {empty[0]!r} has no request in the workload; its SLO would be "
                                             f"met vacuously")
    return StudyContext(spec, workloads, classes, objectives, slo_constraints(selected) + bounds)


def _bound_class(item: str) -> str | None:
    """The class a bound constraint (``"p99_ttft_s:conv <= 2"``) names, if any."""
    head = item.split("<")[0].split(">")[0].strip()
    return head.rpartition(":")[2].strip() or None if ":" in head else None


# ---- storage ---------------------------------------------------------------------------------------------------
def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path not in ("", ":memory:"):
            return Path(path)
    return None


def _ensure_sqlite_dir(url: str, create: bool = True) -> None:
    path = _sqlite_path(url)
    if path is not None and create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("storage", f"cannot create {path.parent} for {url}: {exc.strerror or exc}") from None
        if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise ConfigError("storage", f"cannot write {path} ({url}): permission denied")


@contextlib.contextmanager
def storage_lock(url: str) -> Iterator[None]:
    """Held while a driver creates the schema and the study: an exclusive ``flock`` on ``<db>.lock`` beside a
    SQLite file (nothing for other URLs: :func:`open_study` retries those)."""
    path = _sqlite_path(url)
    if path is None:
        yield
        return
    import fcntl

    try:
        handle = open(f"{path}.lock", "a+")
    except OSError:  # a read-only folder (export, report): nobody creates tables there
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def make_storage(url: str, *, heartbeat: bool = True) -> Any:
    """An Optuna storage for ``url`` (``memory``: in this process only, for benchmarks and notebooks).  RDB URLs get
    the heartbeat (``heartbeat``).  SQLite files get WAL journaling with ``synchronous=NORMAL``: a trial stores
    dozens of user attributes, each its own commit, and a full fsync per commit would dominate short trials."""
    if url == MEMORY:
        return optuna.storages.InMemoryStorage()
    if "://" not in url or url.startswith(("file:", "journal")):
        return url
    import sqlalchemy

    kwargs: dict[str, Any] = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": GRACE_PERIOD_S}
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval, grace_period
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
    if url.startswith("sqlite:"):
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
    _ensure_sqlite_dir(storage, create)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(5):
        try:
            with storage_lock(storage):
                backend = make_storage(storage)
                if create:
                    study = optuna.create_study(storage=backend, sampler=sampler, study_name=spec.name,
                                                directions=ctx.directions, load_if_exists=True)
                else:
                    study = optuna.load_study(study_name=spec.name, storage=backend, sampler=sampler)
                study = _check_identity(ctx, study, storage, create)
            return study
        except KeyError:
            raise ConfigError("storage", f"no study named {spec.name!r} in {storage}; run 'kvtune tune' first") from None
        except (ValueError, ImportError, SQLAlchemyError, optuna.exceptions.DuplicatedStudyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            racing = "already exists" in first or isinstance(exc, optuna.exceptions.DuplicatedStudyError)
            if racing and attempt < 4:  # another driver created it at the same instant: open theirs
                time.sleep(0.2 * (attempt + 1))
                continue
            raise ConfigError("storage", f"cannot open {storage}: {first[:300]}") from None
    raise AssertionError("unreachable")


def _check_identity(ctx: StudyContext, study: optuna.Study, storage: str, create: bool) -> optuna.Study:
    spec = ctx.spec
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


# ---- drivers and orphans -------------------------------------------------------------------------------------
def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (Linux: clock ticks since boot, from ``/proc/<pid>/stat``; elsewhere 0.0 for
    any live process); ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return float(stat[stat.rindex(b")") + 2:].split()[19])  # field 22, after the command name
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:  # alive, another user's
            pass
        return 0.0


def driver_identity() -> dict[str, Any]:
    """Who this driver is: host, pid and the process's start time (so that a reused pid is not mistaken)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(os.getpid())}


def _driver_gone(driver: Any) -> bool:
    if not isinstance(driver, dict) or driver.get("host") != socket.gethostname():
        return False  # another machine's driver: only its heartbeat tells
    pid = driver.get("pid")
    if not isinstance(pid, int):
        return False
    started = _process_start(pid)
    return started is None or (driver.get("started") is not None and started != driver["started"])


def claim_start(study: optuna.Study, url: str) -> int:
    """How many drivers started on this study before this one (and count this one), under the storage lock: a
    sampler seeded with it draws differently from a driver started at the same instant."""
    with storage_lock(url):
        starts = int(study.user_attrs.get(_STARTS_ATTR, 0))
        study.set_user_attr(_STARTS_ATTR, starts + 1)
    return starts


def metric_attrs(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The user attributes a trial stores for its flat ``metrics``: each bucket-cohort family as one dict under
    ``BUCKET_ATTRS[prefix]`` (``output.4096-16384.e2e_s.p99`` -> ``output_buckets["4096-16384.e2e_s.p99"]``), every
    other key as it is.  A trial stores ~1000 metrics, ~830 of them bucket cohorts; Optuna's RDB storage reads every
    attribute row back as an ORM object when it tells a trial and when the next ask refreshes its cache."""
    out: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        prefix, dot, rest = key.partition(".")
        attr = BUCKET_ATTRS.get(prefix) if dot else None
        if attr is None:
            out[key] = value
        else:
            groups.setdefault(attr, {})[rest] = value
    out.update(groups)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def trial_metrics(trial: FrozenTrial | Mapping[str, Any]) -> dict[str, Any]:
    """The flat metrics (``Summary.to_dict()`` keys and values, plus a backend's own numbers such as ``sim.cpu_s``)
    a trial stored, from the trial or its ``user_attrs``: the inverse of :func:`metric_attrs`.  Numeric attributes
    only, less ``NON_METRIC_ATTRS``; a bucket family stored flat (by a kvtune before the grouping: a resumed study
    holds both forms) reads the same."""
    attrs: Mapping[str, Any] = trial.user_attrs if isinstance(trial, FrozenTrial) else trial
    out = {key: value for key, value in attrs.items() if key not in NON_METRIC_ATTRS and _is_number(value)}
    for prefix, attr in BUCKET_ATTRS.items():
        group = attrs.get(attr)
        if isinstance(group, Mapping):
            out.update((f"{prefix}.{label}", value) for label, value in group.items() if _is_number(value))
    return out


def trial_metric(trial: FrozenTrial, key: str, default: Any = None) -> Any:
    """One flat metric of a stored trial (``trial_metrics(trial).get(key, default)`` without building them all)."""
    attrs = trial.user_attrs
    if key in attrs:
        return attrs[key]
    prefix, dot, rest = key.partition(".")
    group = attrs.get(BUCKET_ATTRS[prefix]) if dot and prefix in BUCKET_ATTRS else None
    return group.get(rest, default) if isinstance(group, Mapping) else default


def set_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """``trial.set_user_attr(key, value)`` for every item, in one transaction on a SQLite or PostgreSQL storage.

    Optuna commits each user attribute on its own (a lookup of the trial, an upsert and a commit); a trial stores
    hundreds of metrics, which took longer than the trial's simulation.  Here the trial is checked once (still
    RUNNING: ``UpdateFinishedTrialError`` otherwise, as Optuna raises) and the attributes go in one upsert of Optuna's
    own table executed for all rows (``executemany``), stored exactly as Optuna stores them (``json.dumps`` of the
    value).  Other storages get the per-attribute calls."""
    if not attrs:
        return
    storage = trial.storage
    backend = getattr(storage, "_backend", storage)  # the RDBStorage behind Optuna's cache
    dialect = getattr(getattr(backend, "engine", None), "name", None)
    bulk = isinstance(backend, optuna.storages.RDBStorage) and dialect in ("sqlite", "postgresql")
    if bulk:
        try:
            _upsert_user_attrs(backend, dialect, trial._trial_id, attrs)  # noqa: SLF001
        except (ImportError, AttributeError):
            # Optuna's RDB internals moved (written against optuna 4.x ``storages/_rdb/models.py``): the public
            # per-attribute path is slower but the same.
            bulk = False
    if not bulk:
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial._trial_id, key, value)  # noqa: SLF001
    trial._cached_frozen_trial.user_attrs.update(attrs)  # noqa: SLF001  (what Trial.set_user_attr does too)


def _upsert_user_attrs(backend: Any, dialect: str, trial_id: int, attrs: Mapping[str, Any]) -> None:
    from optuna.storages._rdb import models
    from sqlalchemy.dialects import postgresql, sqlite

    insert = sqlite.insert if dialect == "sqlite" else postgresql.insert
    table = models.TrialUserAttributeModel
    rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
    session = backend.scoped_session()
    try:
        row = models.TrialModel.find_or_raise_by_id(trial_id, session)
        backend.check_trial_is_updatable(trial_id, row.state)
        stmt = insert(table)
        session.execute(stmt.on_conflict_do_update(index_elements=[table.trial_id, table.key],
                                                   set_={"value_json": stmt.excluded.value_json}), rows)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def mark_driver(study: optuna.Study, trial: optuna.Trial, driver: dict[str, Any]) -> None:
    study._storage.set_trial_system_attr(trial._trial_id, DRIVER_ATTR, driver)  # noqa: SLF001


def orphans(study: optuna.Study) -> list[FrozenTrial]:
    """RUNNING trials no live driver runs: their driver process is gone (this host), their heartbeat is stale, or
    they carry neither a driver nor a heartbeat (left by a kvtune before heartbeats)."""
    storage = study._storage  # noqa: SLF001
    stale: set[int] = set()
    heartbeats = heartbeat_enabled(study)
    if heartbeats:
        stale = set(storage._get_stale_trial_ids(study._study_id))  # noqa: SLF001
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        driver = t.system_attrs.get(DRIVER_ATTR)
        if t._trial_id in stale or _driver_gone(driver):  # noqa: SLF001
            out.append(t)
        elif driver is None and (not heartbeats or not _has_heartbeat(storage, t)):
            out.append(t)
    return out


def heartbeat_enabled(study: optuna.Study) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(study._storage)  # noqa: SLF001


def _has_heartbeat(storage: Any, t: FrozenTrial) -> bool:
    from optuna.storages._rdb import models

    rdb = getattr(storage, "_backend", storage)
    session = rdb.scoped_session()
    try:
        return session.query(models.TrialHeartbeatModel).filter_by(trial_id=t._trial_id).count() > 0  # noqa: SLF001
    finally:
        session.close()


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Fail the orphaned RUNNING trials (:func:`orphans`) as ``interrupted`` and enqueue their params again.  Trials
    another live driver runs are left alone; an orphan that another driver recovers first is skipped."""
    storage = study._storage  # noqa: SLF001
    waiting = [t.params for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    recovered = []
    for t in orphans(study):
        try:
            storage.set_trial_user_attr(t._trial_id, FAIL_REASON,  # noqa: SLF001
                                        "interrupted: the driver stopped while this trial ran; re-enqueued")
            storage.set_trial_user_attr(t._trial_id, FAIL_KIND, INTERRUPTED)  # noqa: SLF001
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):  # noqa: SLF001
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another driver recovered it first
        if is_default(t) or (t.params and t.params not in waiting):
            requeue(study, t, {"retry_of": t.number})
            waiting.append(t.params)
        recovered.append(t.number)
    return recovered


def is_default(t: FrozenTrial | optuna.Trial) -> bool:
    """Whether ``t`` runs the engine's default config (:data:`DEFAULT_ATTR`)."""
    return bool(t.user_attrs.get(DEFAULT_ATTR))


def requeue(study: optuna.Study, t: FrozenTrial | optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """Enqueue ``t``'s config again (its params; the default trial, which has none, stays the default)."""
    extra = {DEFAULT_ATTR: True} if is_default(t) else {}
    study.enqueue_trial(dict(t.params), user_attrs={**attrs, **extra})


def ensure_default_trial(study: optuna.Study, target: int) -> bool:
    """Enqueue the default-config trial unless the study already holds one (in any state: a retried or
    interrupted one is enqueued again by :func:`requeue`), or the trials finished and already enqueued fill the
    budget of ``target`` trials (the default would wait behind them forever).  True if it was enqueued now."""
    trials = study.get_trials(deepcopy=False)
    if any(is_default(t) for t in trials):
        return False
    if sum(1 for t in trials if is_finished(t) or t.state == TrialState.WAITING) >= target:
        return False
    study.enqueue_trial({}, user_attrs={DEFAULT_ATTR: True})
    return True


def is_finished(t: FrozenTrial) -> bool:
    """Counts against the trial budget: complete, pruned, or failed for a reason other than an interruption or a
    crash that was retried."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return (t.state == TrialState.FAIL and t.user_attrs.get(FAIL_KIND) != INTERRUPTED
            and not t.user_attrs.get("retried"))


def is_feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in t.user_attrs.get("constraints", ()))
