"""Latency profile files: fitted coefficients for one model on one device (``kvtune calibrate`` writes them).

YAML: ``{kind: kvtune-latency-profile, model, gpu, coefficients: {...LatencyCoefficients fields}, fitted: [...],
fit: {...}}``, or a plain mapping of coefficients.  ``simulate``, ``tune`` (a spec's ``latency_profile``) and
``twin`` read them with :func:`load_profile`; ``model`` and ``gpu`` name what the coefficients were fitted for
(a profile name, or the path of an HF ``config.json`` / device YAML) and are the defaults where a command is
given the profile but no model or device.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ConfigError
from sim.latency._roofline import LatencyCoefficients
from sim.safe_yaml import read_yaml

PROFILE_KIND = "kvtune-latency-profile"
_FIELDS = tuple(f.name for f in dataclasses.fields(LatencyCoefficients))


@dataclass(frozen=True)
class LatencyProfile:
    """A profile file's content: the coefficients and what they were fitted for (``None`` when not recorded)."""

    coefficients: LatencyCoefficients
    model: str | None = None
    gpu: str | None = None
    path: str | None = None


def coefficients_from_mapping(values: dict, where: str = "coefficients") -> LatencyCoefficients:
    """LatencyCoefficients from a mapping; unknown names and non-positive values are errors naming the field."""
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(where, f"unknown latency coefficients {unknown}; known: {list(_FIELDS)}")
    out = {}
    for key, value in values.items():
        if isinstance(value, bool):
            raise ConfigError(f"{where}.{key}", f"must be a number, got {value!r}")
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{key}", f"must be a number, got {value!r}") from None
        if not (value > 0 and (math.isfinite(value) or key == "roofline_norm")):
            raise ConfigError(f"{where}.{key}", f"must be a positive number, got {value!r}")
        out[key] = value
    return LatencyCoefficients(**out)


def read_profile(path: str | Path) -> LatencyProfile:
    """A profile file (``kvtune calibrate`` output, or a plain mapping of coefficients)."""
    path = Path(path).expanduser()
    data = read_yaml(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError("profile", f"{path}: expected a mapping")
    if "coefficients" in data or data.get("kind") == PROFILE_KIND:
        kind = data.get("kind", PROFILE_KIND)
        if kind != PROFILE_KIND:
            raise ConfigError(f"{path}:kind", f"expected {PROFILE_KIND!r}, got {kind!r}")
        values = data.get("coefficients")
        model, gpu = data.get("model"), data.get("gpu")
        for key, value in (("model", model), ("gpu", gpu)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}:{key}", f"must be a string, got {value!r}")
    else:
        values, model, gpu = data, None, None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}:coefficients", "must be a mapping")
    return LatencyProfile(coefficients_from_mapping(values, where=f"{path}:coefficients"), model or None,
                          gpu or None, str(path))


def load_profile(path: str | Path) -> LatencyCoefficients:
    """The coefficients of a profile file."""
    return read_profile(path).coefficients


__all__ = ["LatencyProfile", "PROFILE_KIND", "coefficients_from_mapping", "load_profile", "read_profile"]
