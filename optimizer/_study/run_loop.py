"""One driver's pass over a study (:class:`_Run`): ask for trials while the stored study is short of its target,
submit them to the executor, tell their outcomes as they end; retry crashed trials a bounded number of times;
never run a config the storage already holds a result for (a repeat copies it; one in flight, here or in another
driver, is waited for); on a stop, interrupt what is in flight and enqueue it again, so that the same command
resumes the study.  SIGTERM stops it as gracefully as Ctrl-C (:func:`_graceful_sigterm`)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import warnings
from typing import Any, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from optimizer._backend import TrialBackend
from optimizer._executors import Executor, TrialOutcome
from optimizer._knobs import params_to_knobs, repair_knobs
from optimizer._progress import ProgressLine
from optimizer._storage import (
    FAIL_KIND,
    HEARTBEAT_INTERVAL_S,
    driver_identity,
    heartbeat_enabled,
    is_default,
    is_finished,
    mark_driver,
    recover_interrupted,
    requeue,
)
from optimizer._study.outcomes import _jsonable, copy_result, interrupt, prune, record_outcome
from sim.errors import KvtuneError

#: Times a config whose worker died (``crashed``) is run again, and how many crashes in a row stop the study.
CRASH_RETRIES = 2
MAX_CONSECUTIVE_CRASHES = 6


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
    already holds a result for, retries crashed ones a bounded number of times.

    ``tuner``: the :class:`~optimizer._study.tuner.Tuner` that runs it (its spec, context, workers, timeout,
    phases, crash limits and config check)."""

    def __init__(self, tuner: Any, study: optuna.Study, executor: Executor, backend: TrialBackend,
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
                    filled = None  # the trial's engine config, defaults filled in (repair_knobs), for the check
                    if is_default(trial):  # the engine's default config: nothing searched, nothing repaired
                        knobs = spec.fixed_knobs()
                    else:
                        params = spec.search.suggest(trial, all_knobs=self.grid)
                        knobs = {**spec.fixed_knobs(), **params_to_knobs(params, spec.flavor)}
                        knobs, repaired, filled = repair_knobs(knobs, params, tuner._model_max_len,
                                                               tuner._device_of(knobs))
                        if repaired:
                            trial.set_user_attr("repaired", repaired)
                key = _trial_key(trial) or _params_key(trial.params)
                if key in done:  # the simulator is deterministic: a repeat carries no information
                    copy_result(study, trial, done[key], progress)
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
                problem = tuner._check_config(knobs, filled)
                if problem is not None and problem[0] == "pruned":
                    prune(study, trial, knobs, problem[1], progress)
                    self._told()
                    running -= 1
                    continue
                if problem is not None:
                    self._record(trial, knobs, TrialOutcome(trial.number, None, "error", problem[1]))
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
                copy_result(self.study, trial, source, self.progress)
                self._told()
            else:  # it timed out, crashed or was interrupted: this config runs again, as its own trial
                interrupt(self.study, trial, f"the other driver's trial {number} of this config ended "
                                                         f"without a result; re-enqueued")
        self.remote_followers = waiting

    def _record(self, trial: optuna.Trial, knobs: Mapping[str, Any], outcome: TrialOutcome) -> None:
        record_outcome(self.study, trial, knobs, outcome, self.progress, ctx=self.tuner.ctx, gpu=self.tuner.spec.gpu)

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
            self._record(trial, knobs, outcome)
            if retry:
                progress.failed -= 1  # not a failure of the study's budget: the config runs again
                requeue(study, trial, {"retry_of": trial.number, "crash_attempt": attempt + 1})
                progress.message(f"kvtune: trial {trial.number} is enqueued again (crash retry {attempt + 1} of "
                                 f"{tuner.crash_retries})")
            else:
                self._told()
            for follower, _ in followers:  # they run again themselves, as their own trials
                interrupt(study, follower, "its config's trial crashed; re-enqueued")
            if self.consecutive_crashes >= tuner.max_consecutive_crashes:
                raise StudyStopped(f"{self.consecutive_crashes} trials in a row lost their Ray worker (last: "
                                   f"{outcome.reason}); the study stopped instead of spending its budget on a "
                                   f"failing cluster. Check the workers, then run the same command to resume")
            return
        self.consecutive_crashes = 0
        self._record(trial, knobs, outcome)
        self._told()
        if followers:
            source = study._storage.get_trial(trial._trial_id)  # noqa: SLF001
            for follower, _ in followers:
                if source.state == TrialState.COMPLETE or outcome.kind in _DETERMINISTIC_FAILS:
                    copy_result(study, follower, source, progress)
                    self._told()
                else:  # a timeout may not repeat: the follower runs on its own
                    interrupt(study, follower, f"its config's trial ended ({outcome.kind}); re-enqueued")

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
                interrupt(self.study, trial, f"{reason} while this trial ran; re-enqueued")
            except Exception:  # the storage is gone too: the next driver recovers it as an orphan
                pass
