"""Storing what a trial ended with in the study: its metrics and constraint violations, a failure and its reason,
a pruned deployment, a copy of an earlier trial's result for a config drawn again, an interrupted trial enqueued
again.  Each trial stores every metric of its summary as user attributes (``optimizer._storage.metric_attrs``),
its engine ``knobs`` and its ``constraints`` (SLO violations, <= 0 is feasible), also set through Optuna's
constraint API so that samplers see them."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from optimizer._capacity import priced
from optimizer._executors import TrialOutcome
from optimizer._progress import ProgressLine
from optimizer._samplers import TRIAL_CONSTRAINTS
from optimizer._storage import (
    FAIL_KIND,
    FAIL_REASON,
    INTERRUPTED,
    PRUNE_REASON,
    StudyContext,
    is_default,
    is_feasible,
    metric_attrs,
    requeue,
    set_user_attrs,
)
from sim.errors import KvtuneError

#: Constraint values above this are stored as this (Optuna rejects NaN; some samplers choke on inf).
MAX_VIOLATION = 1e6


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if hasattr(value, "item"):
        return value.item()
    return value


def prune(study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], reason: str,
          progress: ProgressLine) -> None:
    """A capacity-lever combination that cannot start: PRUNED with its reason (counted in the budget)."""
    set_user_attrs(trial, {"knobs": {k: _jsonable(v) for k, v in knobs.items()}, PRUNE_REASON: reason})
    tell(study, trial, state=TrialState.PRUNED)
    progress.message(f"kvtune: trial {trial.number} pruned: {reason}")


def record_outcome(study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], outcome: TrialOutcome,
                   progress: ProgressLine, *, ctx: StudyContext, gpu: Any) -> None:
    """Store a trial's outcome: its metrics, objectives and constraint violations (COMPLETE), or why it failed
    (FAIL); ``gpu``: the study's device (a deployment's price, for cost objectives)."""
    try:
        _store_outcome(study, trial, knobs, outcome, progress, ctx, gpu)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another driver took the trial for an orphan (its heartbeat went stale) and re-enqueued it.
        progress.message(f"kvtune: trial {trial.number} was failed by another driver meanwhile (stale "
                         f"heartbeat); its result is dropped, its config runs again")


def copy_result(study: optuna.Study, trial: optuna.Trial, source: FrozenTrial, progress: ProgressLine) -> None:
    """Tell ``trial`` the stored result of ``source``, a trial with the same params: the simulator is
    deterministic, so running it again would carry no information."""
    skip = {"retry_of", "crash_attempt", "retried", "duplicate_of"}
    # Wholesale, in the source's layout (bucket cohorts grouped, or flat from an earlier kvtune): trial_metrics
    # reads either.
    attrs = {key: value for key, value in source.user_attrs.items() if key not in skip}
    if source.state == TrialState.COMPLETE and TRIAL_CONSTRAINTS:  # before the metrics (see _store_outcome)
        for name, v in zip(source.user_attrs.get("constraint_names", ()), source.user_attrs.get("constraints", ())):
            trial.set_constraint(name, v)
    set_user_attrs(trial, {**attrs, "duplicate_of": source.number, "wall_s": 0.0})
    if source.state == TrialState.COMPLETE:
        tell(study, trial, list(source.values))
        if is_feasible(source):
            progress.observe_feasible(source.values)
    else:
        tell(study, trial, state=TrialState.FAIL)
        progress.failed += 1
    progress.message(f"kvtune: trial {trial.number} drew the config of trial {source.number}; its result is "
                     f"reused, not simulated again")


def interrupt(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """Fail ``trial`` as ``interrupted`` (not counted against the budget) and enqueue its params again."""
    set_user_attrs(trial, {FAIL_REASON: f"interrupted: {reason}", FAIL_KIND: INTERRUPTED})
    tell(study, trial, state=TrialState.FAIL)
    if trial.params or is_default(trial):
        requeue(study, trial, {"retry_of": trial.number})


def _store_outcome(study: optuna.Study, trial: optuna.Trial, knobs: Mapping[str, Any], outcome: TrialOutcome,
                   progress: ProgressLine, ctx: StudyContext, gpu: Any) -> None:
    # Written together (one transaction): a trial stores hundreds of metrics.
    attrs: dict[str, Any] = {"knobs": {k: _jsonable(v) for k, v in knobs.items()},
                             "wall_s": round(outcome.wall_s, 3)}
    if outcome.ok:
        metrics = priced(outcome.metrics or {}, knobs, gpu)  # the deployment's price, for cost objectives
        try:
            values = [float(o.value(metrics)) for o in ctx.objectives]
            bad = [o.name for o, v in zip(ctx.objectives, values) if math.isnan(v)]
            if bad:
                raise KvtuneError(f"objective {bad[0]} is NaN (the run cannot tell it)")
            violations = [min(float(c.violation(metrics)), MAX_VIOLATION) for c in ctx.constraints]
        except KvtuneError as exc:
            outcome = TrialOutcome(outcome.number, None, "error", f"no result: {exc}", outcome.wall_s)
        else:
            # The bucket cohorts grouped, one attribute per family (metric_attrs; trial_metrics reads them).
            attrs.update(metric_attrs({key: _jsonable(value) for key, value in metrics.items()}))
            feasible = all(v <= 0 for v in violations)
            attrs.update(constraints=violations, constraint_names=[c.name for c in ctx.constraints],
                         feasible=feasible)
            if TRIAL_CONSTRAINTS:  # before the metrics: each call reads the whole trial back
                for c, v in zip(ctx.constraints, violations):
                    trial.set_constraint(c.name, v)
            set_user_attrs(trial, attrs)
            tell(study, trial, values)
            if feasible:
                progress.observe_feasible(values)
            return
    set_user_attrs(trial, {**attrs, FAIL_REASON: outcome.reason or outcome.kind, FAIL_KIND: outcome.kind})
    tell(study, trial, state=TrialState.FAIL)
    progress.failed += 1
    progress.message(f"kvtune: trial {outcome.number} failed ({outcome.kind}): {outcome.reason}")


try:  # what Study.tell runs, without its read-back of the told trial (see tell)
    from optuna.study._tell import _tell_with_warning
except ImportError:  # pragma: no cover - Optuna moved it: the public tell does the same, plus the read-back
    _tell_with_warning = None


def tell(study: optuna.Study, trial: Any, values: Sequence[float] | None = None,
          state: TrialState | None = None) -> None:
    """``study.tell``; Optuna's grid sampler calls ``study.stop()`` after the last grid point, which raises outside
    ``optimize`` -- the trial is stored by then (Optuna stores it in a ``finally``), so that error is dropped.

    ``Study.tell`` is Optuna's ``_tell_with_warning`` (checks, the sampler's ``after_trial``, the state and values
    stored) followed by a read-back of the finished trial from the storage and a deep copy of it, which it returns.
    A trial carries ~720 user attributes, and nothing here uses the returned copy, so the read-back is skipped: the
    same function stores the same rows.  (``Study.optimize`` calls ``_tell_with_warning`` the same way.)"""
    try:
        if _tell_with_warning is not None:
            _tell_with_warning(study, trial, value_or_values=values, state=state)
        else:  # pragma: no cover
            study.tell(trial, values, state=state)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise
