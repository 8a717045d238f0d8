"""Search spaces: each knob a range or a set of choices, log scale where it fits, and conditions.

YAML (under ``search:`` of a study spec; keys override the default space, ``null`` drops a knob, ``base: none``
starts from an empty space)::

    search:
      max_num_seqs: {low: 16, high: 512, log: true}
      kv_cache_dtype: [auto, fp8]                       # a list is a set of choices
      preemption_mode: {choices: [recompute, swap]}
      swap_space_gb: {low: 1, high: 64, log: true, when: {preemption_mode: swap}}
      gpu_memory_utilization: {low: 0.8, high: 0.95, step: 0.05, grid_points: 4}
      watermark: null                                   # not searched
      gpu: [L40S, H100-SXM]                             # capacity levers: devices (names or device YAMLs),
      tensor_parallel_size: [1, 2]                      # tensor parallelism (with kv_cache_dtype, quantization)
      replicas: {low: 1, high: 8}                       # engines behind a router (sim/fleet)
      router: [round_robin, sglang_cache_aware]         # the router in front of them
      router.cache_threshold: {low: 0.1, high: 0.9}     # a router's parameter (used by routers that have it)

A knob with ``when`` is suggested only in trials whose parent knob (an earlier categorical knob) took one of the
given values; otherwise the engine keeps its default for it.  ``grid_points`` (or ``grid: [values]``) says how a
range is cut for the grid sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from optimizer._knobs import (MAX_REPLICAS, ROUTER_PARAM, TP_SIZES, VIRTUAL_PREEMPTION, V0_PREEMPTION_CHOICES, V1_PREEMPTION_CHOICES, check_knob,
                              field_type)
from sim.engine.config import EngineConfig
from sim.errors import ConfigError, short_repr
from sim.fields import boolean, check_keys, fail, one_of, to_bool, to_float, to_int

_KNOB_KEYS = ("low", "high", "log", "step", "choices", "when", "grid_points", "grid")
DEFAULT_GRID_POINTS = 4


@dataclass(frozen=True)
class Domain:
    """One knob's values: ``choices``, or a numeric range ``[low, high]`` (``kind`` int or float)."""

    name: str
    kind: str  # "int" | "float" | "categorical"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    #: Parent knob -> values under which this knob is active.
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    grid: tuple[Any, ...] | None = None
    grid_points: int = DEFAULT_GRID_POINTS

    def active(self, params: Mapping[str, Any]) -> bool:
        return all(params.get(parent) in values for parent, values in self.when)

    def suggest(self, trial: Any) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            step = int(self.step) if self.step else 1
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=step, log=self.log)
        value = trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)
        # A stepped float lands on the step's grid; drop the binary noise (0.8700000000000001 -> 0.87).
        return round(value, 10) if self.step else value

    def grid_values(self) -> list[Any]:
        """The values the grid sampler tries."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.grid is not None:
            return list(self.grid)
        n = self.grid_points
        if self.step:
            values = list(np.arange(self.low, self.high + self.step / 2, self.step))
            if len(values) > n:
                idx = np.unique(np.round(np.linspace(0, len(values) - 1, n)).astype(int))
                values = [values[i] for i in idx]
        elif self.log:
            values = list(np.geomspace(self.low, self.high, n))
        else:
            values = list(np.linspace(self.low, self.high, n))
        if self.kind == "int":
            out = sorted({int(round(v)) for v in values})
        else:
            out = sorted({round(float(v), 6) for v in values})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.kind == "categorical":
            out = {"choices": list(self.choices)}
        else:
            out = {"low": self.low, "high": self.high}
            if self.log:
                out["log"] = True
            if self.step:
                out["step"] = self.step
            if self.grid is not None:
                out["grid"] = list(self.grid)
            elif self.grid_points != DEFAULT_GRID_POINTS:
                out["grid_points"] = self.grid_points
        if self.when:
            out["when"] = {parent: list(values) for parent, values in self.when}
        return out


@dataclass(frozen=True)
class SearchSpace:
    """Knobs in order (a conditional knob after its parent)."""

    domains: tuple[Domain, ...] = ()
    flavor: str = "vllm-v1"

    def __post_init__(self) -> None:
        seen: dict[str, Domain] = {}
        for d in self.domains:
            for parent, values in d.when:
                where = f"search.{d.name}.when.{parent}"
                if parent not in seen:
                    raise ConfigError(where, "names no knob searched before this one (a condition needs a searched "
                                             "categorical parent listed earlier)")
                if seen[parent].kind != "categorical":
                    raise ConfigError(where, "a condition's parent must be a knob with choices")
                bad = [v for v in values if v not in seen[parent].choices]
                if bad:
                    raise ConfigError(where, f"{bad} not among {parent}'s choices {list(seen[parent].choices)}")
            seen[d.name] = d

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.domains]

    def __len__(self) -> int:
        return len(self.domains)

    def __getitem__(self, name: str) -> Domain:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def suggest(self, trial: Any, *, all_knobs: bool = False) -> dict[str, Any]:
        """Ask ``trial`` for every active knob; ``all_knobs`` also asks inactive ones (the grid sampler needs a
        value for every grid dimension) but leaves them out of the result."""
        params: dict[str, Any] = {}
        for d in self.domains:
            if d.active(params):
                params[d.name] = d.suggest(trial)
            elif all_knobs:
                d.suggest(trial)
        return params

    def grid(self) -> dict[str, list[Any]]:
        return {d.name: d.grid_values() for d in self.domains}

    def grid_size(self) -> int:
        return int(math.prod(len(v) for v in self.grid().values())) if self.domains else 0

    def to_dict(self) -> dict[str, Any]:
        return {d.name: d.to_dict() for d in self.domains}

    def without(self, names: Sequence[str]) -> "SearchSpace":
        drop = set(names)
        kept = [d for d in self.domains if d.name not in drop and not any(p in drop for p, _ in d.when)]
        return SearchSpace(tuple(kept), self.flavor)


def _check_value(name: str, value: Any, flavor: str, where: str) -> Any:
    """A value EngineConfig accepts for ``name`` in ``flavor`` (its own bounds), or ConfigError at ``where``; for
    the ``gpu`` lever a device reference (checked against the profiles by the study spec)."""
    if name == "gpu":
        if not isinstance(value, str) or not value.strip():
            raise fail(where, "a device name or a device YAML path", value)
        return value
    if name == "tensor_parallel_size":
        one_of(where, value, TP_SIZES)
    if name == "replicas":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
            raise fail(where, f"a whole number of replicas in [1, {MAX_REPLICAS}]", value)
        return value
    if name == "router" or name.startswith(ROUTER_PARAM):
        from sim.fleet import router_class, router_names
    if name == "router":
        if value not in router_names():
            raise ConfigError(where, f"unknown router {short_repr(value)}; routers: {router_names()}")
        return value
    if name.startswith(ROUTER_PARAM):
        param = name[len(ROUTER_PARAM):]
        if not any(param in router_class(r).params for r in router_names()):
            raise ConfigError(where, f"no router has a parameter {param!r}")
        to_float(where, value)
        return value
    kind = field_type(name)
    if kind == "int":
        value = to_int(where, value)
    elif kind == "float":
        value = to_float(where, value)
    elif kind == "bool":
        to_bool(where, value)
    try:
        EngineConfig(flavor=flavor, **{name: value})
    except ConfigError as exc:
        raise ConfigError(where, exc.message) from None
    return value


def parse_domain(name: str, body: Any, flavor: str, where: str) -> Domain:
    """One knob of ``search:``; values are checked against EngineConfig's bounds for ``flavor``."""
    if isinstance(body, (list, tuple)):
        body = {"choices": list(body)}
    if not isinstance(body, Mapping):
        raise fail(where, "a list of choices or a mapping with low/high or choices", body)
    check_keys(body, _KNOB_KEYS, where)
    when = _parse_when(body.get("when"), f"{where}.when")
    virtual = flavor == "vllm-v1" and name == VIRTUAL_PREEMPTION
    if "choices" in body:
        for key in ("low", "high", "log", "step", "grid_points", "grid"):
            if key in body:
                raise ConfigError(f"{where}.{key}", "a knob has either choices or a range (low/high), not both")
        choices = body["choices"]
        if not isinstance(choices, (list, tuple)) or not choices:
            raise fail(f"{where}.choices", "a non-empty list", choices)
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{where}.choices", f"has duplicates: {list(choices)}")
        if virtual:
            bad = [c for c in choices if c not in V1_PREEMPTION_CHOICES]
            if bad:
                raise ConfigError(f"{where}.choices", f"{bad}: vllm-v1 preempts by recompute, or offloads KV to CPU "
                                                      f"(offload); choices are {list(V1_PREEMPTION_CHOICES)}")
            checked = tuple(choices)
        else:
            checked = tuple(_check_value(name, c, flavor, f"{where}.choices[{i}]") for i, c in enumerate(choices))
        return Domain(name, "categorical", choices=checked, when=when)
    if virtual:
        raise ConfigError(where, f"preemption_mode takes choices: {list(V1_PREEMPTION_CHOICES)}")
    kind = field_type(name)
    if kind not in ("int", "float"):
        raise ConfigError(where, f"{name} is not numeric: give choices, e.g. {{choices: [...]}}")
    for key in ("low", "high"):
        if key not in body:
            raise ConfigError(f"{where}.{key}", "is required for a range (or give choices)")
    low = _check_value(name, body["low"], flavor, f"{where}.low")
    high = _check_value(name, body["high"], flavor, f"{where}.high")
    if not low < high:
        raise ConfigError(f"{where}.high", f"must be > low ({low}), got {high}")
    log = boolean(body, "log", where, False)
    if log and not low > 0:
        raise ConfigError(f"{where}.low", f"a log-scale range needs low > 0, got {low}")
    step = body.get("step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not step > 0:
            raise fail(f"{where}.step", "a positive number", step)
        if log:
            raise ConfigError(f"{where}.step", "cannot be combined with log: true (Optuna allows one of them)")
        if kind == "int" and float(step) != int(step):
            raise fail(f"{where}.step", f"a whole number for {name}", step)
    grid = body.get("grid")
    if grid is not None:
        if not isinstance(grid, (list, tuple)) or not grid:
            raise fail(f"{where}.grid", "a non-empty list", grid)
        grid = tuple(_check_value(name, g, flavor, f"{where}.grid[{i}]") for i, g in enumerate(grid))
        out = [g for g in grid if not low <= g <= high]
        if out:
            raise ConfigError(f"{where}.grid", f"{out} outside [low, high] = [{low}, {high}]")
    points = body.get("grid_points", DEFAULT_GRID_POINTS)
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise fail(f"{where}.grid_points", "an integer >= 2", points)
    return Domain(name, kind, low=low, high=high, log=log, step=step, when=when,
                  grid=grid, grid_points=points)


def _parse_when(raw: Any, where: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not raw:
        raise fail(where, "a mapping knob -> value (or list of values)", raw)
    out = []
    for parent, values in raw.items():
        values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
        out.append((str(parent), values))
    return tuple(out)


def default_search_space(flavor: str, target: Any, *, max_model_len: int, fixed: Mapping[str, Any] = (),
                         priorities_differ: bool = False) -> SearchSpace:
    """The space kvtune searches when a study gives none: the scheduler and KV knobs that move the
    throughput/tail trade-off, limited to what ``flavor`` and the target vLLM have."""
    fixed = dict(fixed)
    d: list[Domain] = [
        Domain("max_num_seqs", "int", low=8, high=1024, log=True),
    ]
    if flavor == "vllm-v0" and not fixed.get("enable_chunked_prefill"):
        # Without chunked prefill V0 needs the budget to hold a whole max-length prompt.
        low = max(2048, max_model_len)
        d.append(Domain("max_num_batched_tokens", "int", low=low, high=max(4 * low, 16384), log=True))
    else:
        d.append(Domain("max_num_batched_tokens", "int", low=512, high=16384, log=True))
    if "num_gpu_blocks_override" not in fixed:
        d.append(Domain("gpu_memory_utilization", "float", low=0.80, high=0.95, step=0.01))
    d.append(Domain("kv_cache_dtype", "categorical", choices=("auto", "fp8")))
    d.append(Domain("block_size", "categorical", choices=(16, 32) if flavor == "vllm-v1" else (8, 16, 32)))
    if flavor == "vllm-v1":
        if target is None or target.has_flag("kv-offloading-size"):
            d.append(Domain(VIRTUAL_PREEMPTION, "categorical", choices=V1_PREEMPTION_CHOICES))
            d.append(Domain("kv_offloading_size_gb", "int", low=4, high=128, log=True,
                            when=((VIRTUAL_PREEMPTION, ("offload",)),)))
        if target is None or target.has_flag("watermark"):
            d.append(Domain("watermark", "float", low=0.0, high=0.10, step=0.01))
        if priorities_differ:
            d.append(Domain("scheduling_policy", "categorical", choices=("fcfs", "priority")))
    else:
        d.append(Domain("preemption_mode", "categorical", choices=V0_PREEMPTION_CHOICES))
        d.append(Domain("swap_space_gb", "int", low=1, high=64, log=True,
                        when=(("preemption_mode", ("swap",)),)))
    d.append(Domain("reserved_kv_fraction", "float", low=0.0, high=0.30, step=0.01))
    d.append(Domain("admission_policy", "categorical", choices=("greedy", "predicted")))
    d.append(Domain("admission_headroom", "float", low=0.0, high=0.20, step=0.01,
                    when=(("admission_policy", ("predicted",)),)))
    space = SearchSpace(tuple(d), flavor)
    # Fixed knobs are not searched (a fixed offload size or swap space pins its mode, too).
    drop = [name for name in space.names if name in fixed]
    if flavor == "vllm-v1" and "kv_offloading_size_gb" in fixed:
        drop.append(VIRTUAL_PREEMPTION)
    return space.without(drop)


def parse_search_space(raw: Any, flavor: str, target: Any, *, fixed: Mapping[str, Any], max_model_len: int,
                       priorities_differ: bool = False, where: str = "search") -> SearchSpace:
    """``search:`` of a study spec (``None``: the default space)."""
    base = default_search_space(flavor, target, max_model_len=max_model_len, fixed=fixed,
                                priorities_differ=priorities_differ)
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise fail(where, "a mapping knob -> range/choices", raw)
    raw = dict(raw)
    start = raw.pop("base", "default")
    if start not in ("default", "none"):
        raise fail(f"{where}.base", "'default' or 'none'", start)
    domains: dict[str, Domain] = {} if start == "none" else {d.name: d for d in base.domains}
    for name, body in raw.items():
        here = f"{where}.{name}"
        if not isinstance(name, str):
            raise ConfigError(here, "knob names are strings")
        if body is None:
            domains.pop(name, None)
            continue
        check_knob(name, flavor, target, here, searched=True)
        if name in fixed:
            raise ConfigError(here, f"is also fixed in engine.{name}; a knob is either fixed or searched")
        domains[name] = parse_domain(name, body, flavor, here)
    # Drop default conditional knobs whose parent was removed; order parents before children.
    ordered: list[Domain] = []
    pending = list(domains.values())
    while pending:
        progressed = False
        for d in list(pending):
            parents = [p for p, _ in d.when]
            if all(any(o.name == p for o in ordered) for p in parents):
                ordered.append(d)
                pending.remove(d)
                progressed = True
            elif any(p not in domains for p in parents) and d.name not in raw:
                pending.remove(d)  # a default child whose parent the spec dropped
                progressed = True
        if not progressed:
            d = pending[0]
            missing = [p for p, _ in d.when if p not in domains]
            raise ConfigError(f"{where}.{d.name}.when", f"names {missing or [p for p, _ in d.when]}, which is not "
                                                        "searched (conditions need a searched parent with choices)")
    return SearchSpace(tuple(ordered), flavor)
