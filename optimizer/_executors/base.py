"""What every executor shares: the :class:`Executor` interface, a trial's :class:`TrialOutcome`, the task body
every executor runs for one trial, and the warm-up a worker pays once (:func:`warm_up_trials`)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from optimizer._backend import TrialBackend

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


#: Seconds the warm-up of Ray workers may take (their processes start, kvtune imports) before the study gives up.
WORKER_STARTUP_TIMEOUT_S = 300.0


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
