"""Trial executors: where trials run.  The study asks for up to ``capacity`` trials, submits them, and tells each
result to Optuna as it comes back from :meth:`Executor.wait` (ask/tell, results in finishing order).  Where the
driver has a CPU of its own (:attr:`Executor.asks_ahead`), it also asks for one trial more while every worker is
busy, and submits it the moment one frees, before telling the trial that ended.

- :class:`RayExecutor`: warm Ray workers, one actor per trial slot (one CPU each, and ``gpus_per_trial`` GPUs as a
  Ray resource for replay trials), on a local Ray or an existing cluster by address.  A trial's timeout counts from
  when its worker starts it; a trial past it has its worker killed and replaced; a worker that dies
  (``ActorDiedError`` and the like) fails only its trial.  Ray never retries; the study decides.
- :class:`ProcessExecutor`: worker processes forked from the driver (one per CPU), which inherit the built
  workloads and the warmed-up engine: no Ray to start or stop.  Timeouts and dead workers as with Ray.
- :class:`InProcessExecutor`: one trial at a time in the calling process, for debugging and tests.  The timeout
  is enforced with ``SIGALRM`` when running in the main thread.

:func:`choose_executor` picks one for ``executor: auto`` (the default): Ray for a cluster address, replay
backends, a process that already joined a Ray, or a large study; worker processes otherwise.

Every outcome carries ``kind``: ``ok``, ``error`` (the trial raised), ``timeout`` or ``crashed`` (worker lost).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from optimizer._backend import TrialBackend
from optimizer._spec import EXECUTORS
from sim.errors import ConfigError, KvtuneError

_REASON_CHARS = 600


@dataclass
class TrialOutcome:
    """How one trial ended."""

    number: int
    metrics: dict[str, float] | None = None
    kind: str = "ok"  # ok | error | timeout | crashed
    reason: str | None = None
    wall_s: float = 0.0
    details: str | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _run_trial(backend: TrialBackend, params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, float]:
    """The task body: what every executor runs for one trial."""
    return backend.run(params, list(seeds))


class Executor(ABC):
    """Runs trials; ``submit`` up to ``capacity`` at once, ``wait`` for those that ended."""

    #: The driver has a CPU the trials do not use, so it may ask Optuna for the next trial while they run and hold
    #: it until a worker frees (the study then submits it before telling the trial that ended).
    asks_ahead: bool = False

    @property
    @abstractmethod
    def capacity(self) -> int:
        """Trials that may run at once."""

    @property
    @abstractmethod
    def running(self) -> int:
        """Trials submitted and not yet returned by :meth:`wait`."""

    @abstractmethod
    def submit(self, number: int, backend: TrialBackend, params: Mapping[str, Any], seeds: Sequence[int],
               timeout_s: float | None = None) -> None:
        """Start trial ``number``."""

    @abstractmethod
    def wait(self, timeout_s: float | None = None) -> list[TrialOutcome]:
        """Outcomes of trials that ended (at least one unless ``timeout_s`` passed first or none is running)."""

    def start(self) -> None:
        """Acquire resources (connect to Ray...); called by the study before the first submit."""

    def shutdown(self) -> None:
        """Stop running trials and release resources."""

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self) -> "Executor":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def code_runtime_env() -> dict[str, Any]:
    """A Ray ``runtime_env`` that ships this kvtune's packages to the workers of an existing cluster, so that its
    nodes run the same simulator as the driver (they still need kvtune's dependencies installed)."""
    import importlib

    modules = []
    for name in ("sim", "objectives", "optimizer", "replay"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    return {"py_modules": modules}


class _Timeout(BaseException):
    """Raised by the alarm handler; a BaseException so trial code's ``except Exception`` cannot swallow it."""


class InProcessExecutor(Executor):
    """Sequential trials in this process (``wait`` runs the submitted trial)."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, TrialBackend, Mapping[str, Any], Sequence[int], float | None]] = []

    @property
    def capacity(self) -> int:
        return 1

    @property
    def running(self) -> int:
        return len(self._pending)

    def submit(self, number, backend, params, seeds, timeout_s=None) -> None:
        self._pending.append((number, backend, params, seeds, timeout_s))

    def wait(self, timeout_s: float | None = None) -> list[TrialOutcome]:
        if not self._pending:
            return []
        number, backend, params, seeds, limit = self._pending.pop(0)
        t0 = time.perf_counter()
        use_alarm = bool(limit) and threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
        previous = None
        if use_alarm:
            def _alarm(signum, frame):  # noqa: ARG001
                raise _Timeout()

            previous = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, float(limit))
        try:
            metrics = _run_trial(backend, params, seeds)
            return [TrialOutcome(number, metrics, wall_s=time.perf_counter() - t0)]
        except _Timeout:
            return [TrialOutcome(number, None, "timeout", f"timed out after {limit:g} s",
                                 wall_s=time.perf_counter() - t0)]
        except Exception as exc:  # the trial failed; the study goes on
            return [TrialOutcome(number, None, "error", _reason(exc), wall_s=time.perf_counter() - t0,
                                 details=traceback.format_exc())]
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    def shutdown(self) -> None:
        self._pending.clear()


#: Seconds the warm-up of Ray workers may take (their processes start, kvtune imports) before the study gives up.
WORKER_STARTUP_TIMEOUT_S = 300.0
#: Seconds a live worker has to answer how long its trial has run.
_PROBE_TIMEOUT_S = 10.0


def _driver_priority(niceness: int) -> None:
    """Run trials at the driver's priority (``niceness``: the driver's, when the executor started): Ray starts
    workers at nice 15 (``RAY_worker_niceness``), which starves them next to any other work on the machine, and a
    worker at nice 0 beside a niced driver would take the CPU from the driver that feeds it (and from whatever the
    user niced the study for).  Lowering niceness needs privilege; without it the worker keeps Ray's."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != niceness:
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except (OSError, AttributeError):
        pass


def _own_niceness() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return 0


class _TrialWorker:
    """A warm Ray worker (one actor per trial slot): it runs trials one after another, keeps the backends it was
    sent, and says how long its current trial has run, so that a timeout counts the trial and not the worker's
    start-up or the backend's transfer."""

    def __init__(self, niceness: int = 0) -> None:
        _driver_priority(niceness)
        self._backends: dict[int, TrialBackend] = {}
        self._started: float | None = None

    def ready(self) -> int:
        warm_up_trials()  # paid once, at warm-up, while the driver prepares
        return os.getpid()

    def run(self, key: int, backend_ref: list, params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, float]:
        import ray

        backend = self._backends.get(key)
        if backend is None:
            backend = self._backends[key] = ray.get(backend_ref[0])
        self._started = time.monotonic()
        try:
            return _run_trial(backend, params, seeds)
        finally:
            self._started = None

    def elapsed(self) -> float | None:
        """Seconds the current trial has run (``None``: none is running, e.g. its backend is still arriving)."""
        started = self._started
        return None if started is None else time.monotonic() - started


@dataclass
class _Slot:
    actor: Any
    number: int | None = None
    ref: Any = None
    submitted: float = 0.0
    limit: float | None = None
    #: When the trial's deadline is checked next (submit + limit, moved on by the worker's own elapsed time).
    deadline: float | None = None


class RayExecutor(Executor):
    """Trials on warm Ray workers: one actor per trial slot, started (and warmed up) once, reused by every trial.

    ``address``: an existing cluster (``ray://`` or ``host:port`` or ``auto``); ``None`` starts a local Ray (or
    reuses the one this process already joined).  An address nothing listens at fails in seconds.  ``workers``:
    trials at once (default, and at most: one per CPU of the cluster when it starts).
    ``num_cpus``: CPUs of a local Ray that this executor starts.  ``runtime_env`` goes to ``ray.init``.
    ``gpus_per_trial``: GPUs each worker reserves (``num_gpus``; replay trials launching vLLM); Ray then never
    places two trials on one GPU, and capacity is also at most the cluster's GPUs // ``gpus_per_trial``.

    A trial's timeout counts from the moment its worker starts it (the worker reports it); a trial past it has its
    worker killed and a fresh one started in its place.  A worker that dies fails its trial as ``crashed``.
    """

    @property
    def asks_ahead(self) -> bool:
        """On a cluster the trials run on other CPUs than the driver's; on a local Ray, only if the workers leave
        the machine a CPU.  Where they take every CPU, asking ahead only moves the driver's CPU into the trials'
        time and changes what a sampler such as TPE sees when it draws (it draws with one more trial in flight):
        40 incident trials on 2 local workers, 2 cores, same TPE seeds, took 14.1 / 14.1 / 14.1 s with it and
        14.1 / 13.0 / 13.7 s without; with 1 worker it raised the trial loop's rate from 2.51 / 2.59 to 2.80 / 2.83
        trials/s."""
        if self.address is not None:
            return True
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cpus = os.cpu_count() or 1
        return self._capacity < cpus

    def __init__(self, address: str | None = None, *, workers: int | None = None, num_cpus: int | None = None,
                 runtime_env: dict | None = None, cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0,
                 startup_timeout_s: float = WORKER_STARTUP_TIMEOUT_S):
        self.address = address
        self.workers = workers
        self.num_cpus = num_cpus
        self.runtime_env = runtime_env
        self.cpus_per_trial = cpus_per_trial
        self.gpus_per_trial = float(gpus_per_trial or 0.0)
        self.startup_timeout_s = startup_timeout_s
        self._owns_ray = False
        self._started = False
        self._actor_class: Any = None
        self._capacity = 1
        self._slots: list[_Slot] = []
        self._backend_refs: dict[int, tuple[Any, Any]] = {}  # id(backend) -> (backend, ObjectRef)
        self._niceness = 0  # the driver's, taken when the workers start

    def start(self) -> None:
        if self._started:
            return
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "logging_level": logging.WARNING, "configure_logging": True}
            if self.address is not None:
                check_reachable(self.address)
                kwargs["address"] = self.address
            else:
                # "local": a new local Ray even if RAY_ADDRESS names a cluster (ray.init sets it when it connects).
                kwargs["address"] = "local"
                if self.num_cpus is not None:
                    kwargs["num_cpus"] = self.num_cpus
                # Ray starts workers at nice 15 by default; trials are the work, not background chores.
                os.environ.setdefault("RAY_worker_niceness", "0")
            if self.runtime_env:
                kwargs["runtime_env"] = self.runtime_env
            try:
                init_ray(**kwargs)
            except (ConnectionError, TimeoutError) as exc:
                raise ConfigError("address", f"cannot connect to Ray at {self.address}: "
                                             f"{' '.join(str(exc).split())[:200]}") from None
            self._owns_ray = True
        try:
            slots = self.slots(ray.cluster_resources(), self.cpus_per_trial, self.gpus_per_trial)
        except ConfigError:
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False
            raise
        # More trials at once than the cluster has CPUs (GPUs) for would only queue them, eating into their timeouts.
        self._capacity = min(self.workers, slots) if self.workers else slots
        options: dict[str, Any] = {"num_cpus": self.cpus_per_trial, "max_restarts": 0, "max_task_retries": 0,
                                   "max_concurrency": 2}  # 2: run() and elapsed() at once
        if self.gpus_per_trial > 0:
            options["num_gpus"] = self.gpus_per_trial
        self._actor_class = ray.remote(_TrialWorker).options(**options)
        self._niceness = _own_niceness()
        self._slots = [_Slot(self._actor_class.remote(self._niceness)) for _ in range(self._capacity)]
        self._started = True
        self._warm_up([slot.actor for slot in self._slots])

    def _warm_up(self, actors: list[Any]) -> None:
        import ray

        refs = [a.ready.remote() for a in actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.startup_timeout_s)
        if pending:
            self.shutdown()
            raise KvtuneError(f"Ray workers did not start within {self.startup_timeout_s:g} s "
                              f"({len(pending)} of {len(refs)} still starting); is the cluster short of CPUs?")

    @staticmethod
    def slots(resources: Mapping[str, float], cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0) -> int:
        """Trials a cluster with ``resources`` (``ray.cluster_resources()``) runs at once: its CPUs //
        ``cpus_per_trial`` (at least 1), and with ``gpus_per_trial`` at most its GPUs // ``gpus_per_trial``.  A
        cluster with fewer GPUs than one trial needs is a ConfigError on ``backend.gpus_per_trial``."""
        slots = max(1, int(resources.get("CPU", 1) // cpus_per_trial))
        if gpus_per_trial > 0:
            gpus = float(resources.get("GPU", 0))
            if gpus < gpus_per_trial:
                raise ConfigError("backend.gpus_per_trial", f"each trial needs {gpus_per_trial:g} GPUs but the Ray "
                                                            f"cluster has {gpus:g}; start Ray on GPU nodes (or set "
                                                            f"backend.gpus_per_trial: 0 for the twin)")
            slots = min(slots, int(gpus // gpus_per_trial))
        return slots

    def describe(self) -> str:
        import ray

        where = self.address or "local"
        resources = ray.cluster_resources() if self._started else {}
        cpus = int(resources.get("CPU", 0)) if self._started else "?"
        gpus = ""
        if self.gpus_per_trial > 0:
            gpus = f", {resources.get('GPU', 0):g} GPUs ({self.gpus_per_trial:g} per trial)"
        return f"Ray ({where}, {cpus} CPUs{gpus}, {self._capacity} trials at once)"

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.ref is not None)

    def _backend_ref(self, backend: TrialBackend) -> Any:
        import ray

        key = id(backend)
        if key not in self._backend_refs:
            self._backend_refs[key] = (backend, ray.put(backend))
        return self._backend_refs[key][1]

    def submit(self, number, backend, params, seeds, timeout_s=None) -> None:
        self.start()
        slot = next((s for s in self._slots if s.ref is None), None)
        if slot is None:
            raise RuntimeError(f"all {self._capacity} workers are busy; wait() before submitting more")
        ref = self._backend_ref(backend)
        slot.ref = slot.actor.run.remote(id(backend), [ref], dict(params), list(seeds))
        slot.number, slot.submitted, slot.limit = number, time.monotonic(), timeout_s
        slot.deadline = slot.submitted + timeout_s if timeout_s else None

    def _replace(self, slot: _Slot) -> None:
        """Kill the slot's worker (if alive) and start a fresh one in its place (it warms up on its own)."""
        import ray

        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # already dead
            pass
        slot.actor = self._actor_class.remote(self._niceness)
        slot.actor.ready.remote()
        slot.ref = slot.number = slot.limit = slot.deadline = None

    def _expired(self, now: float) -> list[TrialOutcome]:
        """Trials whose deadline passed: ask each worker how long its trial has really run; those past their limit
        are killed, the others get a later deadline."""
        import ray

        due = [s for s in self._slots if s.ref is not None and s.deadline is not None and now >= s.deadline]
        if not due:
            return []
        probes = {id(s): s.actor.elapsed.remote() for s in due}
        ray.wait(list(probes.values()), num_returns=len(probes), timeout=_PROBE_TIMEOUT_S)
        out = []
        now = time.monotonic()
        for slot in due:
            try:
                elapsed = ray.get(probes[id(slot)], timeout=0)
            except Exception:  # no answer yet: a fresh worker still starting (slow on a loaded machine), or wedged
                if now - slot.submitted <= slot.limit + self.startup_timeout_s:
                    slot.deadline = now + min(slot.limit, 1.0)
                    continue
                elapsed = now - slot.submitted  # past start-up and limit together: give up on it
            if elapsed is None:  # the trial has not started yet (its worker is starting or receiving)
                slot.deadline = now + min(slot.limit, 1.0)
                continue
            if elapsed < slot.limit:
                slot.deadline = now + (slot.limit - elapsed)
                continue
            outcome = TrialOutcome(slot.number, None, "timeout", f"timed out after {slot.limit:g} s (worker killed "
                                   f"and replaced)", wall_s=elapsed)
            self._replace(slot)
            out.append(outcome)
        return out

    def _next_deadline(self, now: float) -> float | None:
        left = [s.deadline - now for s in self._slots if s.ref is not None and s.deadline is not None]
        return max(0.0, min(left)) if left else None

    def wait(self, timeout_s: float | None = None) -> list[TrialOutcome]:
        import ray

        outcomes = self._expired(time.monotonic())
        busy = {s.ref: s for s in self._slots if s.ref is not None}
        if outcomes or not busy:
            return outcomes
        deadline = self._next_deadline(time.monotonic())
        limit = timeout_s
        if deadline is not None:
            limit = deadline + 0.01 if limit is None else min(limit, deadline + 0.01)
        refs = list(busy)
        ready, _ = ray.wait(refs, num_returns=1, timeout=limit)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        now = time.monotonic()
        for ref in ready:
            slot = busy[ref]
            outcome = self._collect(ref, slot.number, now - slot.submitted)
            if outcome.kind == "crashed":
                self._replace(slot)
            else:
                slot.ref = slot.number = slot.limit = slot.deadline = None
            outcomes.append(outcome)
        outcomes.extend(self._expired(now))
        return outcomes

    @staticmethod
    def _collect(ref: Any, number: int, wall_s: float) -> TrialOutcome:
        import ray
        from ray import exceptions as rex

        try:
            return TrialOutcome(number, ray.get(ref), wall_s=wall_s)
        except rex.RayTaskError as exc:  # the trial itself raised
            cause = getattr(exc, "cause", None)
            reason = _reason(cause) if isinstance(cause, BaseException) else _reason(exc)
            return TrialOutcome(number, None, "error", reason, wall_s=wall_s, details=str(exc))
        except rex.TaskCancelledError as exc:
            return TrialOutcome(number, None, "crashed", f"task cancelled: {_reason(exc)}", wall_s=wall_s)
        except (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.LocalRayletDiedError,
                rex.OutOfMemoryError, rex.ObjectLostError, rex.OwnerDiedError) as exc:
            return TrialOutcome(number, None, "crashed", f"worker died ({type(exc).__name__}): "
                                f"{' '.join(str(exc).split())[:_REASON_CHARS]}", wall_s=wall_s)
        except rex.RayError as exc:
            return TrialOutcome(number, None, "crashed", _reason(exc), wall_s=wall_s)

    def shutdown(self) -> None:
        import ray

        for slot in self._slots:
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # best effort: the run is ending anyway
                pass
        self._slots = []
        self._backend_refs.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False
        self._started = False


def _cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def warm_up_trials() -> None:
    """What every simulated trial imports and loads, paid once: in a Ray worker at its warm-up, and in the driver
    before :class:`ProcessExecutor` forks its workers (they inherit it, and the export simulates in the driver)."""
    import objectives  # noqa: F401
    import sim.runner  # noqa: F401
    from sim.engine.decode_columns import warm_up

    warm_up()  # the engine's compiled kernels (numba loads them in about a second)


def _process_worker(conn: Any, backends: dict[int, TrialBackend]) -> None:
    """The body of a :class:`ProcessExecutor` worker (a forked child of the driver): runs the trials it is sent
    one after another until its pipe closes; says when each starts, so that a timeout counts the trial only."""
    import pickle

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle (it then stops the workers)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the driver's graceful handler, inherited by the fork
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        number, key, blob, params, seeds = message
        t0 = time.perf_counter()
        try:
            if blob is not None:
                backends[key] = pickle.loads(blob)
            conn.send(("started", number))
            t0 = time.perf_counter()
            result = ("ok", number, _run_trial(backends[key], params, seeds), time.perf_counter() - t0)
        except Exception as exc:  # the trial failed; the worker goes on
            result = ("error", number, (_reason(exc), traceback.format_exc()), time.perf_counter() - t0)
        try:
            conn.send(result)
        except Exception as exc:  # metrics that do not pickle: the trial's error, not the worker's death
            conn.send(("error", number, (f"its result could not be sent back: {_reason(exc)}", None),
                       time.perf_counter() - t0))


@dataclass
class _Proc:
    process: Any = None
    conn: Any = None
    #: Keys (``id(backend)``) of the backends this worker holds (inherited at its fork or sent to it).
    keys: set = field(default_factory=set)
    number: int | None = None
    submitted: float = 0.0
    started: float | None = None
    limit: float | None = None


class ProcessExecutor(Executor):
    """Trials in worker processes forked from the driver: no Ray to start or stop, so a small study on a laptop
    pays milliseconds instead of seconds around its trials.  ``workers`` trials at once (default: one per CPU).

    A worker is forked at its first trial, after the driver built the workloads and warmed up the engine's
    kernels (:func:`warm_up_trials`), so it inherits both (copy on write): nothing is imported, built or sent per
    trial.  A backend the worker was not forked with is pickled to it once.  Each worker runs trials one after
    another and says when each starts; a trial past its timeout has its worker killed (the next trial forks a fresh
    one), a worker that dies (a crash, SIGKILL, out of memory) fails only its trial, as ``crashed``.  Needs the
    ``fork`` start method (Linux, macOS).
    """

    def __init__(self, workers: int | None = None, *, startup_timeout_s: float | None = None):
        import multiprocessing

        self.workers = workers
        self._capacity = max(1, workers if workers else _cpus())
        self.startup_timeout_s = startup_timeout_s if startup_timeout_s is not None else WORKER_STARTUP_TIMEOUT_S
        self._mp = multiprocessing.get_context("fork")
        self._procs: list[_Proc] = []
        self._backends: dict[int, TrialBackend] = {}
        self._started = False

    @property
    def asks_ahead(self) -> bool:
        """As for a local Ray: only where the workers leave the driver a CPU of its own."""
        return self._capacity < _cpus()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def running(self) -> int:
        return sum(1 for p in self._procs if p.number is not None)

    def describe(self) -> str:
        return f"worker processes (local, {_cpus()} CPUs, {self._capacity} trials at once)"

    def start(self) -> None:
        if self._started:
            return
        warm_up_trials()
        self._procs = [_Proc() for _ in range(self._capacity)]
        self._started = True

    def _fork(self, proc: _Proc) -> None:
        parent, child = self._mp.Pipe()
        backends = dict(self._backends)
        proc.process = self._mp.Process(target=_process_worker, args=(child, backends), daemon=True,
                                        name="kvtune-trial-worker")
        proc.process.start()
        child.close()
        proc.conn = parent
        proc.keys = set(backends)

    def submit(self, number, backend, params, seeds, timeout_s=None) -> None:
        import pickle

        self.start()
        proc = next((p for p in self._procs if p.number is None), None)
        if proc is None:
            raise RuntimeError(f"all {self._capacity} workers are busy; wait() before submitting more")
        key = id(backend)
        self._backends.setdefault(key, backend)
        if proc.process is None or not proc.process.is_alive():
            self._discard(proc)
            self._fork(proc)
        blob = None if key in proc.keys else pickle.dumps(backend)
        proc.conn.send((number, key, blob, dict(params), list(seeds)))
        proc.keys.add(key)
        proc.number, proc.submitted, proc.started, proc.limit = number, time.monotonic(), None, timeout_s

    def _deadline(self, proc: _Proc) -> float | None:
        if not proc.limit:
            return None
        if proc.started is None:  # still receiving its backend: the start-up allowance, then the limit
            return proc.submitted + self.startup_timeout_s + proc.limit
        return proc.started + proc.limit

    def _discard(self, proc: _Proc) -> None:
        """Kill the worker (if alive) and forget it; the next trial on this slot forks a fresh one."""
        if proc.process is not None:
            if proc.process.is_alive():
                proc.process.kill()
            proc.process.join(timeout=5)
        if proc.conn is not None:
            proc.conn.close()
        proc.process = proc.conn = None
        proc.keys = set()
        proc.number = proc.started = proc.limit = None

    def _expired(self, now: float) -> list[TrialOutcome]:
        out = []
        for proc in self._procs:
            deadline = self._deadline(proc) if proc.number is not None else None
            if deadline is None or now < deadline:
                continue
            elapsed = now - (proc.started if proc.started is not None else proc.submitted)
            out.append(TrialOutcome(proc.number, None, "timeout", f"timed out after {proc.limit:g} s (worker killed "
                                    f"and replaced)", wall_s=elapsed))
            self._discard(proc)
        return out

    def wait(self, timeout_s: float | None = None) -> list[TrialOutcome]:
        from multiprocessing.connection import wait as wait_any

        outcomes = self._expired(time.monotonic())
        busy = {id(p.conn): p for p in self._procs if p.number is not None}
        if outcomes or not busy:
            return outcomes
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while not outcomes:
            now = time.monotonic()
            deadlines = [d for d in (self._deadline(p) for p in busy.values()) if d is not None]
            limit = None if end is None else max(0.0, end - now)
            if deadlines:
                left = max(0.0, min(deadlines) - now) + 0.01
                limit = left if limit is None else min(limit, left)
            ready = wait_any([p.conn for p in busy.values()], timeout=limit)
            now = time.monotonic()
            for conn in ready:
                proc = busy[id(conn)]
                outcome = self._receive(proc, now)
                if outcome is not None:
                    outcomes.append(outcome)
                    busy.pop(id(conn), None)
            outcomes.extend(self._expired(now))
            if end is not None and time.monotonic() >= end:
                break
            busy = {id(p.conn): p for p in self._procs if p.number is not None}
            if not busy:
                break
        return outcomes

    def _receive(self, proc: _Proc, now: float) -> TrialOutcome | None:
        """The outcome a worker sent (None: it only said its trial started)."""
        number = proc.number
        try:
            message = proc.conn.recv()
        except (EOFError, OSError):  # the worker died mid-trial
            code = proc.process.exitcode if proc.process is not None else None
            if proc.process is not None:
                proc.process.join(timeout=1)
                code = proc.process.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            wall = now - (proc.started if proc.started is not None else proc.submitted)
            self._discard(proc)
            return TrialOutcome(number, None, "crashed", f"worker died ({how})", wall_s=wall)
        kind = message[0]
        if kind == "started":
            proc.started = now
            return None
        proc.number = proc.started = proc.limit = None
        if kind == "ok":
            return TrialOutcome(number, message[2], wall_s=message[3])
        reason, details = message[2]
        return TrialOutcome(number, None, "error", reason, wall_s=message[3], details=details)

    def shutdown(self) -> None:
        for proc in self._procs:
            if proc.conn is not None and proc.number is None and proc.process is not None and proc.process.is_alive():
                try:
                    proc.conn.send(None)  # an idle worker ends on its own
                except OSError:
                    pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            if proc.process is not None and proc.number is None:
                proc.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._discard(proc)  # a busy (or stuck) one is killed
        self._procs = []
        self._backends.clear()
        self._started = False


#: Under ``executor: auto``, a study of at least this many simulations (trials x replicates) runs on Ray: its
#: start-up and shutdown (~5 s on 2 cores) are then a few percent of the study at most, and a study that size is
#: the one worth moving to a cluster later (the same command with ``--address``).
LARGE_STUDY_RUNS = 1000


def choose_executor(kind: str = "auto", *, address: str | None = None, trials: int = 1, replicates: int = 1,
                    replay: bool = False) -> tuple[str, str]:
    """Which executor a study uses, and why (said in its progress output): ``kind`` as asked, unless ``auto``,
    then ``ray`` for a cluster ``address``, a ``replay`` backend (trials reserve GPUs as Ray resources), a process
    that already joined a Ray, or a large study (:data:`LARGE_STUDY_RUNS`); ``process`` (worker processes forked
    from the driver: no Ray start-up or shutdown) otherwise, or ``in-process`` where ``fork`` is not available."""
    import multiprocessing
    import sys

    if kind not in EXECUTORS:
        raise ConfigError("executor", f"must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    if kind != "auto":
        return kind, "asked for"
    if address:
        return "ray", f"a Ray cluster address was given ({address})"
    if replay:
        return "ray", "replay trials reserve GPUs (and engines) as Ray resources"
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return "ray", "this process has already joined a Ray"
    runs = trials * max(1, replicates)
    if runs >= LARGE_STUDY_RUNS:
        return "ray", f"a large study ({runs} simulations >= {LARGE_STUDY_RUNS}; Ray's start-up is amortized)"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "in-process", "this platform cannot fork worker processes"
    return "process", (f"a small study on this machine ({runs} simulations < {LARGE_STUDY_RUNS}): worker processes "
                       f"start in milliseconds, a local Ray in seconds")


def init_ray(attempts: int = 3, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, tried again when a local node misses Ray's fixed 30 s start-up wait ("The current
    node timed out during startup"), which a machine under heavy CPU contention does now and then."""
    import ray

    for attempt in range(attempts):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this one
            if "timed out during startup" not in str(exc):
                raise
            if ray.is_initialized():
                ray.shutdown()
            if attempt == attempts - 1:
                raise KvtuneError(f"Ray's local node did not start ({attempts} tries of Ray's 30 s start-up wait); "
                                  f"the machine is overloaded, or start Ray yourself and pass --address") from None
            if ray.is_initialized():
                ray.shutdown()


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (a ConfigError on ``address``) when nothing listens at a ``host:port`` or ``ray://host:port`` Ray
    address: ``ray.init`` would retry it for minutes.  ``auto`` and other forms are left to Ray."""
    import socket

    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in target:
        return
    if not 0 < int(port) < 65536:
        raise ConfigError("address", f"port {port} is out of range in {address!r}")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError("address", f"cannot reach Ray at {address}: {exc.strerror or exc}") from None
