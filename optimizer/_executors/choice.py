"""Which executor a study runs on under ``executor: auto`` (:func:`choose_executor`), and why."""

from __future__ import annotations

from optimizer._spec import EXECUTORS
from sim.errors import ConfigError

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
