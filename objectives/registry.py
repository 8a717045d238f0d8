"""Objectives and constraints the optimizer can name in a study spec.

Both read the flat summary (``Summary.to_dict()``), so they work on a fresh ``Summary`` and on a finished trial's
metrics alike: a trial stores the bucket cohorts grouped (one user attribute per ``BUCKET_PREFIXES`` family), so
pass its flat metrics, ``optimizer.trial_metrics(trial)``, not its raw ``user_attrs``.  Definitions of the figures:
``objectives/README.md``.

Names (``[:<cohort>]``: all requests, or ``:<class>``, or a bucket such as ``:output.4096-16384``):

- throughput: ``output_tokens_per_s``, ``goodput_rps`` (maximize);
- busy time: ``new_token_busy_share`` (maximize), ``recompute_busy_share`` (minimize), and the token shares
  ``recompute_token_share`` (minimize), ``new_token_token_share`` (maximize); ``kv_utilization`` (maximize);
- SLO attainment: ``slo_attainment[:<cohort>]`` (all targets met), ``{ttft,tpot,e2e}_attainment[:<cohort>]``
  (maximize; lost requests are misses);
- latency tails: ``p{50,90,99}_{ttft,tpot,e2e}_s[:<cohort>]``, ``censored_{ttft,e2e}_share[:<cohort>]``;
- stalls: ``p{50,90,99}_itl_s`` (run), ``{p50,p90,p99,max}_{max_itl,preempted,queue_wait,resume_wait}_s[:<cohort>]``;
- preemption depth: ``preemptions_per_request`` (mean), ``preemptions_per_request_{p99,max}``,
  ``preempted_ge2_share``, ``preempted_ge1_share`` (minimize).
- cost: ``cost_per_hour_usd``, ``usd_per_million_output_tokens`` (minimize; they read the deployment's price,
  ``objectives.PRICE_KEY``, which the backend adds to the metrics: ``objectives._cost``).

Constraints: every class SLO target (``slo_constraints``), and bounds on any objective, written
``"<objective> <= <number>"`` or ``">="`` (``parse_bound``), e.g. ``"slo_attainment:chat >= 0.95"``.
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
    """A class's p99 target.  Met (p99 <= target): violation ``(p99 - target) / target`` (<= 0, relative so
    classes with targets of different sizes weigh alike).  Missed: the class's miss share, the share of its
    requests over the target, timed-out, cancelled and rejected ones counting as misses (> 0 whenever the p99
    misses; unlike the p99, which sticks at the timeout once 1% time out, it tells 2% lost requests from 55%).
    A class with no requests is feasible (0.0); an SLO its run cannot verify (p99 or attainment unknown) counts
    as violated (+inf)."""

    class_name: str
    metric: str  # "ttft_s" | "tpot_s" | "e2e_s"
    target_s: float

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"slo:{self.class_name}:p99_{self.metric}<={self.target_s:g}"

    def violation(self, summary: SummaryLike) -> float:
        prefix = f"class.{self.class_name}"
        who = f"constraint.{self.name}"
        p99 = _lookup(summary, f"{prefix}.{self.metric}.p99", who)
        if math.isnan(p99):
            return 0.0 if _lookup(summary, f"{prefix}.count.total", who) == 0 else math.inf
        if p99 <= self.target_s:
            return (p99 - self.target_s) / self.target_s
        attainment = _lookup(summary, f"{prefix}.{self.metric}.attainment", who)
        return math.inf if math.isnan(attainment) else max(1.0 - attainment, 1e-9)


@dataclass(frozen=True)
class BoundConstraint(Constraint):
    """``<objective> <= bound`` or ``>= bound``: violation is the excess over the bound relative to it
    (absolute when the bound is 0); an unknown value (NaN) is violated (+inf)."""

    objective: Objective
    op: Literal["<=", ">="]
    bound: float

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.objective.name}{self.op}{self.bound:g}"

    def violation(self, summary: SummaryLike) -> float:
        value = self.objective.value(summary)
        if math.isnan(value):
            return math.inf
        excess = value - self.bound if self.op == "<=" else self.bound - value
        if math.isinf(excess):
            return math.inf if excess > 0 else -1.0
        return excess / abs(self.bound) if self.bound else excess


_BOUND = re.compile(r"^\s*(\S+?)\s*(<=|>=)\s*(\S+)\s*$")


def is_bound(text: object) -> bool:
    """Whether a constraints entry is a bound (it has ``<=`` or ``>=``) rather than a class name."""
    return isinstance(text, str) and ("<=" in text or ">=" in text)


def parse_bound(text: str, classes: Mapping[str, RequestClass] | None = None) -> BoundConstraint:
    """``"p99_itl_s <= 0.2"`` -> a :class:`BoundConstraint`; a ``ConfigError`` for anything else."""
    match = _BOUND.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError("constraints", f"{text!r} is not '<objective> <= <number>' or '<objective> >= <number>'")
    name, op, number = match.groups()
    try:
        bound = float(number)
    except ValueError:
        raise ConfigError("constraints", f"{text!r}: bound {number!r} is not a number") from None
    if math.isnan(bound):
        raise ConfigError("constraints", f"{text!r}: bound is NaN")
    return BoundConstraint(get_objective(name, classes), op, bound)  # type: ignore[arg-type]


_REGISTRY: dict[str, Objective] = {}


def register_objective(objective: Objective) -> None:
    """Add an objective under its name (a second one with the same name is a ``ConfigError``)."""
    if objective.name in _REGISTRY:
        raise ConfigError("objective", f"an objective named {objective.name!r} is already registered")
    _REGISTRY[objective.name] = objective


for _name, _direction, _key in (
    ("output_tokens_per_s", "maximize", "output_tokens_per_s"),
    ("goodput_rps", "maximize", "goodput_rps"),
    ("new_token_busy_share", "maximize", "new_token_busy_share"),
    ("recompute_busy_share", "minimize", "recompute_busy_share"),
    ("new_token_token_share", "maximize", "new_token_token_share"),
    ("recompute_token_share", "minimize", "recompute_token_share"),
    ("kv_utilization", "maximize", "kv_utilization"),
    ("preemptions_per_request", "minimize", "preemptions_per_request.mean"),
    ("preemptions_per_request_p99", "minimize", "preemptions_per_request.p99"),
    ("preemptions_per_request_max", "minimize", "preemptions_per_request.max"),
    ("preempted_ge1_share", "minimize", "preemptions_per_request.share_ge1"),
    ("preempted_ge2_share", "minimize", "preemptions_per_request.share_ge2"),
    ("p50_itl_s", "minimize", "itl_s_p50"),
    ("p90_itl_s", "minimize", "itl_s_p90"),
    ("p99_itl_s", "minimize", "itl_s_p99"),
):
    register_objective(SummaryKeyObjective(_name, _direction, _key))

#: Per-cohort patterns: regex -> (direction, key under the cohort's prefix).
_COHORT_PATTERNS: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"^p(50|90|99)_(ttft|tpot|e2e)_s$"), "minimize", "{1}_s.p{0}"),
    (re.compile(r"^(p50|p90|p99|max)_(max_itl|preempted|queue_wait|resume_wait)_s$"), "minimize", "{1}_s.{0}"),
    (re.compile(r"^slo_attainment$"), "maximize", "slo_attainment"),
    (re.compile(r"^(ttft|tpot|e2e)_attainment$"), "maximize", "{0}_s.attainment"),
    (re.compile(r"^censored_(ttft|e2e)_share$"), "minimize", "{0}_s.censored_share"),
)
_PATTERN_NAMES = [
    "p{50,90,99}_{ttft,tpot,e2e}_s[:<cohort>]", "{p50,p90,p99,max}_{max_itl,preempted,queue_wait,resume_wait}_s[:<cohort>]",
    "slo_attainment[:<cohort>]", "{ttft,tpot,e2e}_attainment[:<cohort>]", "censored_{ttft,e2e}_share[:<cohort>]",
]


def objective_names() -> list[str]:
    """Registered names plus the per-cohort patterns (``<cohort>``: a class, or a bucket like
    ``output.4096-16384``), as shown in error messages."""
    return sorted(_REGISTRY) + _PATTERN_NAMES


def get_objective(name: str, classes: Mapping[str, RequestClass] | None = None) -> Objective:
    """The objective called ``name``; with ``classes``, a ``:<class>`` suffix must name one of them (a bucket
    suffix, with a dot, is checked when the objective reads a summary)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    base, _, cohort = name.partition(":")
    for pattern, direction, key in _COHORT_PATTERNS:
        match = pattern.match(base)
        if match is None:
            continue
        if cohort and "." not in cohort and classes is not None and cohort not in classes:
            raise ConfigError("objective", f"{name!r} names class {cohort!r}; classes: {sorted(classes)}")
        prefix = "all" if not cohort else cohort if "." in cohort else f"class.{cohort}"
        return SummaryKeyObjective(name, direction, f"{prefix}.{key.format(*match.groups())}")
    raise ConfigError("objective", f"unknown objective {name!r}; known: {', '.join(objective_names())}")


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
