"""Running a study: an Optuna study in its storage, trials asked for and told back as executors finish them.

- The study lives in its storage (SQLite under the out dir by default) under the spec's name; running the same
  command again resumes it.  Trials a killed driver left RUNNING are failed as ``interrupted`` and enqueued again
  with the same parameters; the trial budget counts finished trials (complete, pruned, or failed for a reason of
  their own), so nothing finished is lost or counted twice.
- Each trial stores every metric of its summary as user attributes (``class.<name>.e2e_s.p99`` ... one attribute
  each; each bucket-cohort family as one dict: ``prompt_buckets``, ``output_buckets``, ``preempted_buckets``, see
  ``optimizer._storage.metric_attrs``; read them back flat with ``trial_metrics``), its engine ``knobs``, and its
  ``constraints`` (SLO violations, <= 0 is feasible), also set through Optuna's constraint API so that samplers see
  them.
- A failed trial (it raised, timed out, or its worker died) is told as FAIL with ``fail_reason`` / ``fail_kind``.
- The target vLLM's default config (the spec's fixed knobs, nothing searched; every replicate seed) is one of the
  study's trials, the first one a fresh study runs, marked ``kvtune_default`` (``optimizer._storage.DEFAULT_ATTR``)
  and counted in the trial budget (a grid study runs every grid point and the default).  The export compares every
  candidate with it.

Modules, one idea each: :mod:`~optimizer._study.tuner` (the spec to a context, a storage, a backend and an
executor; :class:`Tuner`), :mod:`~optimizer._study.run_loop` (ask, submit, tell; crash retries, reuse of stored
results, interrupts and resume), :mod:`~optimizer._study.outcomes` (what a trial's end stores) and
:mod:`~optimizer._study.result` (:class:`StudyResult`).
"""

from __future__ import annotations

from optimizer._storage import (
    FAIL_KIND,
    FAIL_REASON,
    INTERRUPTED,
    MEMORY,
    StudyContext,
    is_feasible,
    is_finished,
    open_study,
    prepare,
    recover_interrupted,
)
from optimizer._study.result import StudyResult, split_wall
from optimizer._study.run_loop import StudyStopped, Terminated
from optimizer._study.tuner import Tuner, run_study

__all__ = ["FAIL_KIND", "FAIL_REASON", "INTERRUPTED", "MEMORY", "StudyContext", "StudyResult", "StudyStopped",
           "Terminated", "Tuner", "is_feasible", "is_finished", "open_study", "prepare", "recover_interrupted",
           "run_study", "split_wall"]
