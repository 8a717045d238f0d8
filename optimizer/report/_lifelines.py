"""Lifelines of single requests: when each one queued, ran, was preempted, waited and recomputed.

A :class:`LifelineRecorder` is the engine observer of a report's re-simulation (called after every
``schedule()``): it notes every preemption, and for requests preempted earlier the steps that re-prefill them
(the resume).  :func:`lifelines` turns that and the two tables into segments on one time axis for the requests
preempted most often.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from sim.engine.scheduler_output import split_tokens

#: Requests a lifeline chart shows (the most preempted ones).
MAX_LIFELINES = 8


@dataclass
class LifelineRecorder:
    """Engine observer: preemption instants and recompute steps per request id."""

    preemptions: dict[int, list[float]] = field(default_factory=dict)
    recompute: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (iteration, tokens)
    _pending: set[int] = field(default_factory=set)

    def __call__(self, iteration: int, now: float, out) -> None:
        for victim in out.preempted:
            self.preemptions.setdefault(victim.request_id, []).append(now)
            self._pending.add(victim.request_id)
        if not self._pending:
            return
        for req, num_new in out.scheduled:
            if req.request_id in self._pending:
                recompute = split_tokens(req, num_new)[1]
                if recompute:
                    self.recompute.setdefault(req.request_id, []).append((iteration, recompute))
                if req.num_computed_tokens + num_new >= req.high_water:
                    self._pending.discard(req.request_id)  # caught up: running again


@dataclass(frozen=True)
class Lifeline:
    """One request on the time axis (seconds of the run): ``segments`` are ``(kind, start, end)`` with kind
    ``queued`` (arrival to first scheduling), ``running``, ``preempted`` (preemption to the step that resumes it),
    ``recompute`` (the steps re-prefilling it); ``preempt_s`` the preemption instants."""

    request_id: int
    label: str
    segments: tuple[tuple[str, float, float], ...]
    preempt_s: tuple[float, ...]
    first_token_s: float
    end_s: float
    status: str


def lifelines(recorder: LifelineRecorder, requests: pd.DataFrame, steps: pd.DataFrame,
              limit: int = MAX_LIFELINES) -> list[Lifeline]:
    """The ``limit`` most preempted requests (ties: longest preempted time), most preempted first."""
    if requests is None or not len(requests) or steps is None or not recorder.preemptions:
        return []
    timing = steps.set_index("step")[["start_s", "duration_s"]]
    order = requests.assign(_p=requests["num_preemptions"], _s=requests.get("preempted_s", 0.0))
    order = order[order["_p"] > 0].sort_values(["_p", "_s"], ascending=False).head(limit)
    out = []
    for _, row in order.iterrows():
        rid = int(row["request_id"])
        arrival, first, end = float(row["arrival_s"]), float(row["first_scheduled_s"]), float(row["end_s"])
        recompute = []
        for iteration, _ in recorder.recompute.get(rid, []):
            if iteration in timing.index:
                start, duration = timing.loc[iteration]
                recompute.append((float(start), float(start + duration)))
        preempts = sorted(recorder.preemptions.get(rid, []))
        segments: list[tuple[str, float, float]] = [("queued", arrival, first)] if first == first else []
        run_start = first
        for t in preempts:
            segments.append(("running", run_start, t))
            resume = next((s for s, _ in recompute if s >= t), end)
            segments.append(("preempted", t, resume))
            run_start = resume
        if run_start == run_start and end == end:
            segments.append(("running", run_start, end))
        segments += [("recompute", s, e) for s, e in recompute]
        label = (f"#{rid} {row['class']}: {int(row['num_preemptions'])} preemptions, "
                 f"{int(row['prompt_tokens'])}+{int(row['output_tokens_target'])} tokens")
        out.append(Lifeline(rid, label, tuple(segments), tuple(preempts), float(row["first_token_s"]), end,
                            str(row["status"])))
    return out
