"""Trials in worker processes forked from the driver (:class:`ProcessExecutor`): they inherit the built workloads
and the warmed-up engine, and no Ray is started or stopped."""

from __future__ import annotations

import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from optimizer._backend import TrialBackend
from optimizer._executors.base import (WORKER_STARTUP_TIMEOUT_S, Executor, TrialOutcome, _cpus, _reason, _run_trial,
                                       warm_up_trials)


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
