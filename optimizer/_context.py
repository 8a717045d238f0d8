"""The context a study's run, its trial backends and its export share (:class:`StudyContext`); it imports no
other optimizer module at run time, so that the backends, the executors and the study loop can all name it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from objectives.registry import Constraint, Objective
    from optimizer._spec import StudySpec
    from sim.workload.classes import RequestClass
    from sim.workload.workload import Workload


@dataclass
class StudyContext:
    """What running and exporting a study both need: the built workloads, classes, objectives, constraints."""

    spec: StudySpec
    workloads: dict[int, Workload]
    classes: dict[str, RequestClass]
    objectives: list[Objective]
    constraints: list[Constraint]

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def seeds(self) -> list[int]:
        return list(self.workloads)


__all__ = ["StudyContext"]
