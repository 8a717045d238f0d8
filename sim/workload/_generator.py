"""Synthetic traffic: per class, a renewal arrival process (rate, burstiness CV) and length distributions.

Each class draws from its own child random stream (``SeedSequence(seed).spawn``), so adding a class does not
change the requests the other classes get, and the same seed always gives the same workload.

YAML (under ``workload: generator:``)::

    duration_s: 600              # or num_requests: 5000
    classes:
      conv:
        rate_rps: 5.5
        cv: 1.1                  # inter-arrival CV; 1 is Poisson
        prompt_tokens: {dist: lognormal, mu: 6.93, sigma: 0.6, min: 2, max: 14050}
        output_tokens: {dist: lognormal, mu: 4.86, sigma: 0.66, min: 7, max: 1000}
      code:
        rate_rps: 2.5
        lengths: {dist: empirical, trace: bundled, class: conv}   # joint (prompt, output) resampling

or ``servegen: {path: ..., clients: [...], start_s: ..., duration_s: ...}`` (``sim.workload._servegen``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from sim.errors import ConfigError
from sim.workload._arrivals import ArrivalSpec, arrival_times
from sim.fields import check_keys, mapping, number
from sim.workload._lengths import Empirical, LengthDist, empirical_from_dict, length_from_dict
from sim.workload._loader import assemble
from sim.workload._report import LoadReport
from sim.workload._rules import ClassRules
from sim.workload._servegen import ServeGenSpec, servegen_frame
from sim.workload.workload import Workload

_TRAFFIC_KEYS = ("rate_rps", "cv", "prompt_tokens", "output_tokens", "lengths")


@dataclass(frozen=True)
class ClassTraffic:
    """One class's traffic: arrivals at ``rate_rps`` with inter-arrival CV ``cv``, and its lengths.

    Either ``lengths`` (empirical pairs) or both ``prompt_tokens`` and ``output_tokens`` (distributions).
    """

    name: str
    rate_rps: float
    cv: float = 1.0
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    lengths: Empirical | None = None

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any], where: str) -> "ClassTraffic":
        d = mapping(d, where)
        check_keys(d, _TRAFFIC_KEYS, where)
        rate = number(d, "rate_rps", where, positive=True)
        cv = number(d, "cv", where, 1.0, positive=True)
        if "lengths" in d:
            if "prompt_tokens" in d or "output_tokens" in d:
                raise ConfigError(f"{where}.lengths", "give either lengths (empirical pairs) or prompt_tokens and "
                                  "output_tokens, not both")
            return cls(name, rate, cv, lengths=empirical_from_dict(d["lengths"], f"{where}.lengths"))
        dists = {k: length_from_dict(d[k], f"{where}.{k}") for k in ("prompt_tokens", "output_tokens") if k in d}
        for key in ("prompt_tokens", "output_tokens"):
            if key not in dists:
                raise ConfigError(f"{where}.{key}", "is required (or give lengths: {dist: empirical, ...})")
        return cls(name, rate, cv, dists["prompt_tokens"], dists["output_tokens"])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rate_rps": round(float(self.rate_rps), 6), "cv": round(float(self.cv), 4)}
        if self.lengths is not None:
            out["lengths"] = self.lengths.to_dict()
        else:
            assert self.prompt_tokens is not None and self.output_tokens is not None
            out["prompt_tokens"] = self.prompt_tokens.to_dict()
            out["output_tokens"] = self.output_tokens.to_dict()
        return out

    @property
    def arrival(self) -> ArrivalSpec:
        return ArrivalSpec("poisson", self.rate_rps) if self.cv == 1.0 else ArrivalSpec("gamma", self.rate_rps, self.cv)


@dataclass(frozen=True)
class GeneratorSpec:
    """Classes of synthetic traffic, run for ``duration_s`` seconds or until ``num_requests`` requests."""

    classes: tuple[ClassTraffic, ...]
    duration_s: float | None = None
    num_requests: int | None = None

    def __post_init__(self) -> None:
        if (self.duration_s is None) == (self.num_requests is None):
            raise ConfigError("generator", "give exactly one of duration_s and num_requests")
        if not self.classes:
            raise ConfigError("generator.classes", "needs at least one class")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "generator") -> "GeneratorSpec | ServeGenSpec":
        """Per-class traffic, or ``{servegen: {...}}``: production distributions (``sim.workload._servegen``)."""
        d = mapping(d, where)
        if "servegen" in d:
            check_keys(d, ("servegen",), where)
            return ServeGenSpec.from_dict(d["servegen"], f"{where}.servegen")
        check_keys(d, ("duration_s", "num_requests", "classes", "servegen"), where)
        duration = number(d, "duration_s", where, None, positive=True)
        count = number(d, "num_requests", where, None, integer=True, minimum=1)
        if (duration is None) == (count is None):
            raise ConfigError(f"{where}.duration_s", "give exactly one of duration_s and num_requests")
        if "classes" not in d:
            raise ConfigError(f"{where}.classes", "is required")
        body = mapping(d["classes"], f"{where}.classes")
        if not body:
            raise ConfigError(f"{where}.classes", "needs at least one class")
        traffic = tuple(ClassTraffic.from_dict(str(n), v, f"{where}.classes.{n}") for n, v in body.items())
        return cls(traffic, duration, count)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.duration_s is not None:
            out["duration_s"] = round(float(self.duration_s), 6)
        if self.num_requests is not None:
            out["num_requests"] = int(self.num_requests)
        out["classes"] = {c.name: c.to_dict() for c in self.classes}
        return out


def _empirical_pairs(spec: Empirical, base_dir: Path | None, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    from sim.workload._loader import read_rows
    from sim.workload._rules import auto_classes

    path = spec.resolved(base_dir)
    key = (str(path), spec.format)
    if key not in cache:
        cache[key] = read_rows(path, spec.format).frame
    frame = cache[key]
    if spec.trace_class is not None:
        labels, _, _ = auto_classes(frame)
        frame = frame[labels == spec.trace_class]
        if frame.empty:
            raise ConfigError("lengths.class", f"{path} has no rows of class {spec.trace_class!r}")
    return frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy()


def generate_frame(spec: GeneratorSpec, seed: int, base_dir: Path | None = None) -> pd.DataFrame:
    """Rows (arrival_s, prompt_tokens, output_tokens, trace_class) sorted by arrival; deterministic in ``seed``."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(spec.classes))]
    cache: dict = {}
    parts = []
    for traffic, rng in zip(spec.classes, streams):
        if spec.num_requests is not None:
            arrivals = arrival_times(traffic.arrival, rng, n=spec.num_requests)
        else:
            arrivals = arrival_times(traffic.arrival, rng, duration_s=spec.duration_s)
        n = len(arrivals)
        if traffic.lengths is not None:
            prompts, outputs = _empirical_pairs(traffic.lengths, base_dir, cache)
            pick = rng.integers(0, len(prompts), n)
            prompt, output = prompts[pick], outputs[pick]
        else:
            assert traffic.prompt_tokens is not None and traffic.output_tokens is not None
            prompt = traffic.prompt_tokens.sample(n, rng)
            output = traffic.output_tokens.sample(n, rng)
        parts.append(pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompt.astype(np.int64),
                                   "output_tokens": output.astype(np.int64),
                                   "trace_class": np.full(n, traffic.name, dtype=object)}))
    frame = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if spec.num_requests is not None:
        frame = frame.iloc[: spec.num_requests].reset_index(drop=True)
    return frame


def generate(spec: GeneratorSpec | ServeGenSpec, seed: int = 0, *, classes: ClassRules | None = None,
             base_dir: Path | None = None) -> Workload:
    """A synthetic Workload; without class rules each generator class (ServeGen: each client) is a plain class
    of the same name."""
    if isinstance(spec, ServeGenSpec):
        frame, source, fmt = servegen_frame(spec, seed, base_dir), f"<servegen {spec.path}>", "servegen"
    else:
        frame, source, fmt = generate_frame(spec, seed, base_dir), "<generator>", "generator"
    return assemble(frame, classes, source, LoadReport(source=source, fmt=fmt, rows_read=len(frame)))
