"""Target vLLM versions and the real ``vllm serve`` flags each has (``optimizer/data/vllm_flags.yaml``).

A study names the vLLM it will deploy on: an exact release (``"0.8.5"``, ``"==0.10.2"``) or a floor
(``">=0.18"``: any release from 0.18 on).  The flag table holds the flags read from ``vllm/engine/arg_utils.py`` of
a handful of releases.  A flag counts as present for a target only where the table can vouch for it:

- exact release ``X``: the flag is in every listed release between the nearest listed one at or below ``X`` and
  the nearest at or above ``X`` (both, when ``X`` falls between two of them; the newest alone beyond it);
- floor ``>=X``: the flag is in every listed release from the nearest at or below ``X`` up to the newest.

So a flag added or removed between two listed releases is never promised for a release in that gap.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from sim.errors import ConfigError
from sim.safe_yaml import read_package_yaml

_VERSION = re.compile(r"^\s*(==|>=)?\s*v?(\d+(?:\.\d+){0,3})((?:\.?post\d+)|(?:rc\d+))?\s*$")


def parse_release(text: str, where: str = "vllm_version") -> tuple[int, ...]:
    """``"0.8.5.post1"`` -> ``(0, 8, 5)``: the release numbers, padded to three (post/rc suffixes dropped)."""
    match = _VERSION.match(str(text))
    if match is None or match.group(1):
        raise ConfigError(where, f"cannot read {text!r} as a vLLM release such as 0.8.5")
    parts = tuple(int(p) for p in match.group(2).split("."))
    return parts + (0,) * (3 - len(parts))


@dataclass(frozen=True)
class ReleaseFlags:
    """The flags of one listed vLLM release, as read from its ``vllm/engine/arg_utils.py``."""

    version: str
    release: tuple[int, ...]
    flags: frozenset[str]
    negatable: frozenset[str]
    engines: frozenset[str]
    source: str


@functools.cache
def flag_table() -> tuple[ReleaseFlags, ...]:
    """Every listed release, oldest first."""
    data = read_package_yaml("optimizer", "data", "vllm_flags.yaml")["versions"]
    out = [
        ReleaseFlags(
            version=str(version),
            release=parse_release(str(version)),
            flags=frozenset(entry["flags"]),
            negatable=frozenset(entry.get("negatable") or ()),
            engines=frozenset(entry["engines"]),
            source=str(entry["source"]),
        )
        for version, entry in data.items()
    ]
    return tuple(sorted(out, key=lambda r: r.release))


@dataclass(frozen=True)
class VllmTarget:
    """The vLLM a recommendation is for: ``==X`` (one release) or ``>=X`` (that release and every later one)."""

    text: str
    release: tuple[int, ...]
    floor: bool = False

    @classmethod
    def parse(cls, value: Any, where: str = "vllm_version") -> "VllmTarget":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(where, f"write the version as a string (\"{value}\" in quotes); YAML read it as a number")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(where, f"must be a vLLM release such as \"0.8.5\" or a floor such as \">=0.18\", got {value!r}")
        text = value.strip()
        if text == "latest":
            newest = flag_table()[-1]
            return cls(newest.version, newest.release, False)
        match = _VERSION.match(text)
        if match is None:
            raise ConfigError(where, f"cannot read {value!r}: give a release such as \"0.8.5\" or a floor such as \">=0.18\"")
        release = parse_release(match.group(2) + (match.group(3) or ""), where)
        oldest = flag_table()[0]
        if release < oldest.release:
            raise ConfigError(where, f"{text}: kvtune has vLLM flag data from {oldest.version} on "
                                     f"(optimizer/data/vllm_flags.yaml)")
        return cls(text, release, match.group(1) == ">=")

    def __str__(self) -> str:
        return self.text

    @property
    def releases(self) -> tuple[ReleaseFlags, ...]:
        """The listed releases whose flags bound what this target has (see the module docstring)."""
        table = flag_table()
        below = [r for r in table if r.release <= self.release]
        above = [r for r in table if r.release >= self.release]
        low = below[-1]
        if self.floor:
            return tuple(r for r in table if r.release >= low.release)
        high = above[0] if above else table[-1]
        return tuple(r for r in table if low.release <= r.release <= high.release)

    @functools.cached_property
    def flags(self) -> frozenset[str]:
        """Flags (without the leading ``--``) that every release of this target has."""
        return frozenset.intersection(*(r.flags for r in self.releases))

    @functools.cached_property
    def negatable(self) -> frozenset[str]:
        return frozenset.intersection(*(r.negatable for r in self.releases))

    @functools.cached_property
    def engines(self) -> frozenset[str]:
        """``v0``/``v1``: the engines every release of this target ships."""
        return frozenset.intersection(*(r.engines for r in self.releases))

    @property
    def simulated_release(self) -> str:
        """The release whose engine defaults a simulation of this target uses: the release itself, or for a
        floor the newest listed release (what installing ``>=X`` gives today)."""
        if self.floor:
            return flag_table()[-1].version
        return ".".join(str(p) for p in self.release)

    def has_flag(self, flag: str) -> bool:
        return flag.lstrip("-") in self.flags

    def sources(self) -> list[str]:
        return [r.source for r in self.releases]


def _semantics(release: tuple[int, ...], knob_flags: frozenset[str], flags: frozenset[str]) -> dict[str, object]:
    """What a simulation of one release depends on beyond the flags an export writes: which simulated knobs have a
    flag there, and the memory-profiling regime that sizes the KV cache (sim/engine/sizing.py)."""
    from sim.engine.sizing import CUDAGRAPH_ESTIMATE_FROM, V1_PROFILER_FROM

    return {
        "flags": knob_flags & flags,
        "cudagraph_estimate": release >= CUDAGRAPH_ESTIMATE_FROM,
        "v1_profiler": release >= V1_PROFILER_FROM,
    }


def version_validity(target: VllmTarget, knob_flags: frozenset[str]) -> dict[str, object]:
    """For each listed release of ``target``: does a recommendation simulated with ``target.simulated_release``
    hold there?  ``knob_flags``: the ``vllm serve`` flags of the knobs kvtune simulates.  A release differs when one
    of those flags is missing there (its behaviour falls back to that release's default) or when it sizes the KV
    cache differently (CUDA-graph estimate from 0.21, the V1 worker's profiler from 0.10)."""
    simulated = parse_release(target.simulated_release)
    table = {r.release: r for r in flag_table()}
    base_row = table.get(simulated) or [r for r in flag_table() if r.release <= simulated][-1]
    base = _semantics(simulated, knob_flags, base_row.flags)
    holds, differs = [], {}
    for r in target.releases:
        sem = _semantics(r.release, knob_flags, r.flags)
        reasons = [f"has no --{f}" for f in sorted(base["flags"] - sem["flags"])]
        if sem["cudagraph_estimate"] != base["cudagraph_estimate"]:
            reasons.append("sizes the KV cache " + ("without" if base["cudagraph_estimate"] else "after subtracting")
                           + " the CUDA-graph memory estimate (about 1 GiB of KV per GPU)")
        if sem["v1_profiler"] != base["v1_profiler"]:
            reasons.append("profiles non-torch memory differently (V0-era profiler: 1.8-3.6 GiB instead of 0.25-2.1)")
        if reasons:
            differs[r.version] = reasons
        else:
            holds.append(r.version)
    return {"simulated_release": target.simulated_release, "holds_for": holds, "differs": differs}


def default_target(flavor: str) -> VllmTarget:
    """The newest listed release that ships the flavor's engine."""
    engine = "v0" if flavor == "vllm-v0" else "v1"
    release = [r for r in flag_table() if engine in r.engines][-1]
    return VllmTarget(release.version, release.release, False)
