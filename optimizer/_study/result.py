"""What a study's run left in storage (:class:`StudyResult`) and where its wall time went (:func:`split_wall`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass
class StudyResult:
    """What a run left in storage."""

    name: str
    storage: str
    target: int
    finished: int
    complete: int
    failed: int
    feasible: int
    ran: int
    wall_s: float
    recovered: list[int] = field(default_factory=list)
    #: Wall seconds by phase of the driver (:class:`~optimizer._progress.Phases`).
    phases: dict[str, float] = field(default_factory=dict)
    #: The executor the trials ran on (``ray``, ``process``, ``in-process``, or the class name of one passed in;
    #: None when nothing was left to run) and why it was chosen.
    executor: str | None = None
    executor_reason: str | None = None

    @property
    def split(self) -> dict[str, float]:
        """:attr:`wall_s` in four parts that sum to it: ``start`` (building the workloads, opening the storage,
        starting the executor), ``storage`` (asking the sampler for trials and storing their results), ``shutdown``
        (stopping the executor), and ``trials`` (the rest: trials running, and what the driver does between)."""
        return split_wall(self.wall_s, self.phases)

    def split_text(self) -> str:
        """``start 0.4 s, trials 5.1 s, storage 0.9 s, shutdown 0.0 s``."""
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.split.items())

    def to_dict(self) -> dict[str, Any]:
        """What ``kvtune tune`` writes to ``<out>/study_run.json``."""
        return {"name": self.name, "storage": self.storage, "target": self.target, "finished": self.finished,
                "complete": self.complete, "failed": self.failed, "feasible": self.feasible, "ran": self.ran,
                "recovered": list(self.recovered), "executor": self.executor, "executor_reason": self.executor_reason,
                "wall_s": round(self.wall_s, 3), "split_s": {k: round(v, 3) for k, v in self.split.items()},
                "phases_s": {k: round(v, 3) for k, v in self.phases.items()}}


#: Driver phases (:class:`~optimizer._progress.Phases`) in each part of :attr:`StudyResult.split`; ``trials`` is the
#: rest of the wall time.
SPLIT_PHASES = {"start": ("prepare", "storage", "executor_start"), "storage": ("ask", "tell"),
                "shutdown": ("shutdown",)}


def split_wall(wall_s: float, phases: Mapping[str, float]) -> dict[str, float]:
    """``wall_s`` as ``start``, ``trials``, ``storage``, ``shutdown`` (see :attr:`StudyResult.split`)."""
    parts = {name: sum(phases.get(k, 0.0) for k in keys) for name, keys in SPLIT_PHASES.items()}
    trials = max(0.0, wall_s - sum(parts.values()))
    return {"start": parts["start"], "trials": trials, "storage": parts["storage"], "shutdown": parts["shutdown"]}
