"""Arrival processes: Poisson, gamma renewal (burstiness as the CV of inter-arrival times), or trace replay.

Real LLM traffic is burstier than Poisson (the Azure code trace's inter-arrival CV is ~13); a gamma renewal
process keeps the mean rate and sets that CV, which is what drives queueing and KV-cache pressure peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from sim.errors import ConfigError
from sim.fields import check_keys, mapping, number, string

ARRIVAL_PROCESSES = ("poisson", "gamma", "replay")


@dataclass(frozen=True)
class ArrivalSpec:
    """``process``: ``poisson``, ``gamma`` or ``replay`` (keep the trace's own timestamps).

    ``rate_rps``: mean requests per second; ``None`` keeps the trace's own mean rate (required where there is no
    trace rate: length-only files, generators). ``cv``: coefficient of variation of inter-arrival times (gamma
    only; 1 is Poisson, larger is burstier).
    """

    process: str = "poisson"
    rate_rps: float | None = None
    cv: float = 1.0

    def __post_init__(self) -> None:
        if self.process not in ARRIVAL_PROCESSES:
            raise ConfigError("arrival.process", f"must be one of {list(ARRIVAL_PROCESSES)}, got {self.process!r}")
        if self.rate_rps is not None and not (self.rate_rps > 0 and math.isfinite(self.rate_rps)):
            raise ConfigError("arrival.rate_rps", f"must be > 0, got {self.rate_rps!r}")
        if not (self.cv > 0 and math.isfinite(self.cv)):
            raise ConfigError("arrival.cv", f"must be > 0, got {self.cv!r}")
        if self.process == "poisson" and self.cv != 1.0:
            raise ConfigError("arrival.cv", "a Poisson process has cv 1; use process: gamma for another cv")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "arrival") -> "ArrivalSpec":
        d = mapping(d, where)
        check_keys(d, ("process", "rate_rps", "cv"), where)
        process = string(d, "process", where, "poisson", ARRIVAL_PROCESSES)
        rate = number(d, "rate_rps", where, None, positive=True)
        cv = number(d, "cv", where, 1.0, positive=True)
        if process == "poisson" and cv != 1.0:
            raise ConfigError(f"{where}.cv", "a Poisson process has cv 1; use process: gamma for another cv")
        return cls(process, rate, cv)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"process": self.process}
        if self.rate_rps is not None:
            out["rate_rps"] = float(self.rate_rps)
        if self.process == "gamma":
            out["cv"] = float(self.cv)
        return out


def _gaps(process: str, rate: float, cv: float, size: int, rng: np.random.Generator) -> np.ndarray:
    if process == "poisson" or cv == 1.0:
        return rng.exponential(1.0 / rate, size)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate * shape), size)


def arrival_times(spec: ArrivalSpec, rng: np.random.Generator, *, rate_rps: float | None = None,
                  n: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Sorted arrival times from 0: exactly ``n`` of them, or all before ``duration_s``.

    ``rate_rps`` is used when the spec leaves the rate open (the trace's own rate).
    """
    if spec.process == "replay":
        raise ConfigError("arrival.process", "'replay' keeps a trace's own timestamps and cannot generate arrivals")
    rate = spec.rate_rps if spec.rate_rps is not None else rate_rps
    if rate is None:
        raise ConfigError("arrival.rate_rps", "is required here (there is no trace rate to keep)")
    if n is not None:
        return np.cumsum(_gaps(spec.process, rate, spec.cv, n, rng))
    if duration_s is None:
        raise ValueError("give n or duration_s")
    chunks: list[np.ndarray] = []
    t = 0.0
    chunk = max(64, int(rate * duration_s * 1.05) + 64)
    while t < duration_s:
        times = t + np.cumsum(_gaps(spec.process, rate, spec.cv, chunk, rng))
        chunks.append(times)
        t = float(times[-1])
    out = np.concatenate(chunks)
    return out[out < duration_s]


def interarrival_cv(arrivals: np.ndarray) -> float:
    """CV of the gaps between sorted arrivals (NaN with fewer than 3 arrivals or all at one instant)."""
    gaps = np.diff(np.asarray(arrivals, dtype=float))
    if len(gaps) < 2 or gaps.mean() <= 0:
        return float("nan")
    return float(gaps.std() / gaps.mean())
