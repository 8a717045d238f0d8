"""Length distributions for synthetic requests: fitted lognormal, constant, or empirical resampling of a trace.

The lognormal is fitted to a trace's median and p99 (not by maximum likelihood): LLM length distributions are
not quite lognormal, and KV-cache pressure is set by the tail, so the fit pins the two quantiles that matter
and lets the body differ. Empirical resampling draws (prompt, output) pairs together, keeping their correlation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union

import numpy as np

from sim.errors import ConfigError
from sim.fields import check_keys, mapping, number, string

#: Standard normal quantile at 0.99: the p99 of a lognormal is exp(mu + Z99 * sigma).
Z99 = 2.3263478740408408


@dataclass(frozen=True)
class Lognormal:
    """Token counts ``round(exp(N(mu, sigma)))`` clipped to ``[min, max]``."""

    mu: float
    sigma: float
    min: int = 1
    max: int | None = None

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        values = np.rint(np.exp(rng.normal(self.mu, self.sigma, n)))
        return np.clip(values, self.min, self.max if self.max is not None else np.inf).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dist": "lognormal", "mu": round(float(self.mu), 6), "sigma": round(float(self.sigma), 6),
                               "min": int(self.min)}
        if self.max is not None:
            out["max"] = int(self.max)
        return out


@dataclass(frozen=True)
class Constant:
    """Every request has ``value`` tokens (micro-benchmarks, sanity checks)."""

    value: int

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": "constant", "value": int(self.value)}


LengthDist = Union[Lognormal, Constant]


@dataclass(frozen=True)
class Empirical:
    """Resample (prompt, output) pairs of a trace's rows with the class label ``trace_class`` (all rows if None)."""

    trace: str
    format: str | None = None
    trace_class: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dist": "empirical", "trace": self.trace}
        if self.format:
            out["format"] = self.format
        if self.trace_class:
            out["class"] = self.trace_class
        return out

    def resolved(self, base_dir: Path | None) -> Path:
        from sim.workload._paths import resolve_trace_path

        return resolve_trace_path(self.trace, base_dir)


def length_from_dict(d: Mapping[str, Any], where: str) -> LengthDist:
    d = mapping(d, where)
    dist = string(d, "dist", where, None, ("lognormal", "constant"))
    if dist == "constant":
        check_keys(d, ("dist", "value"), where)
        return Constant(number(d, "value", where, integer=True, minimum=1))
    if dist != "lognormal":
        raise ConfigError(f"{where}.dist", "is required: lognormal or constant")
    check_keys(d, ("dist", "mu", "sigma", "min", "max"), where)
    low = number(d, "min", where, 1, integer=True, minimum=1)
    high = number(d, "max", where, None, integer=True, minimum=1)
    if high is not None and high < low:
        raise ConfigError(f"{where}.max", f"must be >= min ({low}), got {high}")
    return Lognormal(number(d, "mu", where), number(d, "sigma", where, minimum=0.0), low, high)


def empirical_from_dict(d: Mapping[str, Any], where: str) -> Empirical:
    d = mapping(d, where)
    check_keys(d, ("dist", "trace", "format", "class"), where)
    string(d, "dist", where, "empirical", ("empirical",))
    fmt = string(d, "format", where, None)
    if fmt is not None:
        from sim.workload._detect import check_format

        check_format(fmt, f"{where}.format")
    return Empirical(string(d, "trace", where), fmt, string(d, "class", where, None))


def fit_lognormal(values: np.ndarray) -> Lognormal:
    """Lognormal through the sample's median and p99, clipped to the sample's range."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        raise ValueError("cannot fit lengths of an empty sample")
    p50, p99 = np.percentile(values, [50, 99])
    mu = math.log(max(p50, 1.0))
    sigma = max((math.log(max(p99, 1.0)) - mu) / Z99, 0.0)
    return Lognormal(mu, sigma, int(values.min()), int(values.max()))
