"""What a deployment costs: its price per hour and the price of its output tokens.

The price is not in a run's tables; the backend adds it to a trial's metrics under :data:`PRICE_KEY`, computed
by :func:`deployment_price` (the device's on-demand price per GPU-hour, ``sim/data/hardware.yaml``, times
``tensor_parallel_size`` times replicas).  Both cost objectives read it from the flat metrics, next to
``output_tokens_per_s``:

- ``cost_per_hour_usd`` (minimize): the price itself, USD per hour;
- ``usd_per_million_output_tokens`` (minimize): ``price / 3600 / output_tokens_per_s * 1e6``, ``inf`` for a run
  that produced no output token.

A metrics mapping without the price key is a ``ConfigError``, like a missing summary key; a device without a
price (0.0 means unknown) is a ``ConfigError`` from :func:`deployment_price` rather than a free deployment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from objectives.registry import Direction, Objective, SummaryLike, _flat, _lookup, register_objective
from sim.errors import ConfigError
from sim.fields import fail

#: Metrics key of the deployment's price, USD per hour: device price x tensor_parallel_size x replicas.
PRICE_KEY = "deployment.price_per_hour_usd"


def deployment_price(gpu_profile: Any, tensor_parallel_size: int, replicas: int = 1) -> float:
    """USD per hour of ``replicas`` engines of ``tensor_parallel_size`` GPUs each: the device's
    ``price_per_hour_usd`` (per GPU) x ``tensor_parallel_size`` x ``replicas``.  ``gpu_profile`` is a
    ``GpuProfile`` or anything ``load_gpu`` takes (a name, an alias, a device YAML's path).  A device without a
    price (0.0, unknown) is a ``ConfigError`` naming it."""
    from sim.profiles import load_gpu

    gpu = load_gpu(gpu_profile)
    for field, value in (("tensor_parallel_size", tensor_parallel_size), ("replicas", replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(field, "an integer >= 1", value)
    if not gpu.has_price:
        raise ConfigError("gpu", f"device {gpu.name!r} has no price (price_per_hour_usd {gpu.price_per_hour_usd:g}, "
                                 f"which means unknown), so a cost objective cannot be computed for it; give "
                                 f"price_per_hour_usd in its device YAML")
    return gpu.price_per_hour_usd * tensor_parallel_size * replicas


def _price(summary: SummaryLike, who: str) -> float:
    if PRICE_KEY not in _flat(summary):
        raise ConfigError(who, f"the metrics have no {PRICE_KEY!r} (the deployment's price in USD per hour, which "
                               f"the backend adds for a cost objective: objectives.deployment_price)")
    price = _lookup(summary, PRICE_KEY, who)
    if not math.isnan(price) and price <= 0:
        raise ConfigError(who, f"{PRICE_KEY} is {price:g}: a deployment without a price (0.0 means unknown) has "
                               f"no cost")
    return price


@dataclass(frozen=True)
class CostPerHourObjective(Objective):
    """The deployment's price, USD per hour (:data:`PRICE_KEY`)."""

    name: str = "cost_per_hour_usd"
    direction: Direction = "minimize"

    def value(self, summary: SummaryLike) -> float:
        return _price(summary, f"objective.{self.name}")


@dataclass(frozen=True)
class UsdPerMillionOutputTokensObjective(Objective):
    """USD per million output tokens: price / 3600 / ``output_tokens_per_s`` * 1e6 (``inf`` at no throughput,
    NaN when either is unknown)."""

    name: str = "usd_per_million_output_tokens"
    direction: Direction = "minimize"

    def value(self, summary: SummaryLike) -> float:
        who = f"objective.{self.name}"
        price = _price(summary, who)
        rate = _lookup(summary, "output_tokens_per_s", who)
        if math.isnan(price) or math.isnan(rate):
            return math.nan
        if rate <= 0:
            return math.inf
        return price / 3600.0 / rate * 1e6


register_objective(CostPerHourObjective())
register_objective(UsdPerMillionOutputTokensObjective())
