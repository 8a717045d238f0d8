"""Trials on warm Ray workers (:class:`RayExecutor`), on a local Ray or a cluster, and the Ray plumbing it needs:
starting Ray (:func:`init_ray`), failing fast on an unreachable address (:func:`check_reachable`), shipping this
kvtune to a cluster's nodes (:func:`code_runtime_env`)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from optimizer._backend import TrialBackend
from optimizer._executors.base import (_REASON_CHARS, WORKER_STARTUP_TIMEOUT_S, Executor, TrialOutcome, _cpus, _reason,
                                       _run_trial, warm_up_trials)
from sim.errors import ConfigError, KvtuneError

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
        return self._capacity < _cpus()

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
