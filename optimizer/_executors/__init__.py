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

Modules, one idea each: :mod:`~optimizer._executors.base` (the interface, outcomes, the trial body and warm-up),
:mod:`~optimizer._executors.in_process`, :mod:`~optimizer._executors.process_pool`,
:mod:`~optimizer._executors.ray_workers` (with starting and reaching Ray) and :mod:`~optimizer._executors.choice`.
"""

from __future__ import annotations

from optimizer._executors.base import (
    WORKER_STARTUP_TIMEOUT_S,
    Executor,
    TrialOutcome,
    warm_up_trials,
)
from optimizer._executors.choice import LARGE_STUDY_RUNS, choose_executor
from optimizer._executors.in_process import InProcessExecutor
from optimizer._executors.process_pool import ProcessExecutor
from optimizer._executors.ray_workers import RayExecutor, check_reachable, code_runtime_env, init_ray

__all__ = ["Executor", "InProcessExecutor", "LARGE_STUDY_RUNS", "ProcessExecutor", "RayExecutor", "TrialOutcome",
           "WORKER_STARTUP_TIMEOUT_S", "check_reachable", "choose_executor", "code_runtime_env", "init_ray",
           "warm_up_trials"]
