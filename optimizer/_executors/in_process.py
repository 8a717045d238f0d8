"""One trial at a time in the calling process (:class:`InProcessExecutor`), for debugging and tests."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from typing import Any, Mapping, Sequence

from optimizer._backend import TrialBackend
from optimizer._executors.base import Executor, TrialOutcome, _reason, _run_trial


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
