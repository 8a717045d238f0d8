"""Objectives and constraints the optimizer can name in a study spec.

Both read the flat summary (``Summary.to_dict()``, which is also what a trial stores as user attributes), so
they work on a fresh ``Summary`` and on a finished trial's ``user_attrs`` alike.

Names: ``output_tokens_per_s``, ``goodput_rps`` (maximize), ``recompute_share`` (minimize),
``new_token_busy_share``, ``kv_utilization`` (maximize), ``preemptions_per_request`` (minimize), and the
latency percentiles ``p{50,90,99}_{ttft,tpot,e2e}_s`` (all requests) or ``...:<class>`` (one class), minimize.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Union

from objectives._summary import Summary
from sim.errors import ConfigError
from sim.workload.classes import RequestClass

Direction = Literal["maximize", "minimize"]
SummaryLike = Union[Summary, Mapping[str, float]]

_LATENCY = re.compile(r"^p(50|90|99)_(ttft|tpot|e2e)_s(?::(.+))?$")


def _flat(summary: SummaryLike) -> Mapping[str, float]:
    return summary.to_dict() if isinstance(summary, Summary) else summary


def _lookup(summary: SummaryLike, key: str, who: str) -> float:
    flat = _flat(summary)
    if key not in flat:
        classes = sorted({k.split(".")[1] for k in flat if k.startswith("class.")})
        raise ConfigError(who, f"the summary has no {key!r} (classes in it: {classes})")
    return float(flat[key])


class Objective(ABC):
    """One number to optimize per trial; ``direction`` is Optuna's ``"maximize"``/``"minimize"``."""

    name: str
    direction: Direction

    @abstractmethod
    def value(self, summary: SummaryLike) -> float:
        """The objective's value for one run (NaN when the run's tables cannot tell)."""


class Constraint(ABC):
    """A feasibility condition in Optuna's convention, ``violation <= 0`` is feasible.  Optuna 5 takes it per
    trial as ``trial.set_constraint(c.name, c.violation(summary))`` (``constraints_func`` is deprecated)."""

    name: str

    @abstractmethod
    def violation(self, summary: SummaryLike) -> float:
        """How far the run is from feasible; never NaN (Optuna rejects NaN constraint values)."""


@dataclass(frozen=True)
class SummaryKeyObjective(Objective):
    """An objective that is one key of the flat summary."""

    name: str
    direction: Direction
    key: str

    def value(self, summary: SummaryLike) -> float:
        return _lookup(summary, self.key, f"objective.{self.name}")


@dataclass(frozen=True)
class SloConstraint(Constraint):
    """A class's p99 target: violation ``(p99 - target) / target``, relative so classes with targets of
    different sizes weigh alike.  A class with no requests is feasible (0.0); an SLO its run cannot verify
    (p99 unknown) counts as violated (+inf), as does a p99 of +inf (requests that never got an answer)."""

    class_name: str
    metric: str  # "ttft_s" | "tpot_s" | "e2e_s"
    target_s: float

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"slo:{self.class_name}:p99_{self.metric}<={self.target_s:g}"

    def violation(self, summary: SummaryLike) -> float:
        prefix = f"class.{self.class_name}"
        p99 = _lookup(summary, f"{prefix}.{self.metric}.p99", f"constraint.{self.name}")
        if math.isnan(p99):
            return 0.0 if _lookup(summary, f"{prefix}.count.total", f"constraint.{self.name}") == 0 else math.inf
        return (p99 - self.target_s) / self.target_s


_REGISTRY: dict[str, Objective] = {}


def register_objective(objective: Objective) -> None:
    """Add an objective under its name (a second one with the same name is a ``ConfigError``)."""
    if objective.name in _REGISTRY:
        raise ConfigError("objective", f"an objective named {objective.name!r} is already registered")
    _REGISTRY[objective.name] = objective


for _name, _direction, _key in (
    ("output_tokens_per_s", "maximize", "output_tokens_per_s"),
    ("goodput_rps", "maximize", "goodput_rps"),
    ("recompute_share", "minimize", "recompute_share"),
    ("new_token_busy_share", "maximize", "new_token_busy_share"),
    ("kv_utilization", "maximize", "kv_utilization"),
    ("preemptions_per_request", "minimize", "preemptions_per_request.mean"),
):
    register_objective(SummaryKeyObjective(_name, _direction, _key))


def objective_names() -> list[str]:
    """Registered names plus the latency patterns, as shown in error messages."""
    return sorted(_REGISTRY) + ["p{50,90,99}_{ttft,tpot,e2e}_s", "p{50,90,99}_{ttft,tpot,e2e}_s:<class>"]


def get_objective(name: str, classes: Mapping[str, RequestClass] | None = None) -> Objective:
    """The objective called ``name``; with ``classes``, a ``:<class>`` suffix must name one of them."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    match = _LATENCY.match(name)
    if match is None:
        raise ConfigError("objective", f"unknown objective {name!r}; known: {', '.join(objective_names())}")
    q, metric, cls = match.groups()
    if cls is not None and classes is not None and cls not in classes:
        raise ConfigError("objective", f"{name!r} names class {cls!r}; classes: {sorted(classes)}")
    prefix = "all" if cls is None else f"class.{cls}"
    return SummaryKeyObjective(name, "minimize", f"{prefix}.{metric}_s.p{q}")


def slo_constraints(classes: Mapping[str, RequestClass]) -> list[Constraint]:
    """One constraint per SLO target of every class, in class then metric order."""
    return [
        SloConstraint(name, metric, target)
        for name, cls in classes.items()
        for metric, target in cls.slo.targets().items()
    ]


def constraint_values(constraints: list[Constraint], summary: SummaryLike) -> tuple[float, ...]:
    """The violations of ``constraints`` for one run, in order (what a ``constraints_func`` returns)."""
    return tuple(c.violation(summary) for c in constraints)
