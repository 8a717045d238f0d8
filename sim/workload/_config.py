"""Small typed getters for ``from_dict``: every bad key or value becomes a ConfigError naming its full path."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Iterable

from sim.errors import ConfigError

_MISSING = object()


def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(value).__name__} {value!r}")
    return value


def check_keys(d: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = list(allowed)
    for key in d:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", f"unknown key; expected one of {allowed}")


def number(d: Mapping[str, Any], key: str, where: str, default: Any = _MISSING, *, minimum: float | None = None,
           positive: bool = False, integer: bool = False, maximum: float | None = None) -> Any:
    """``d[key]`` as a float (or int), checked; ``default`` when absent (a required key has none)."""
    field = f"{where}.{key}"
    if key not in d or d[key] is None:
        if default is _MISSING:
            raise ConfigError(field, "is required")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(field, f"must be finite, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise ConfigError(field, f"must be a whole number, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if positive and not value > 0:
        raise ConfigError(field, f"must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(field, f"must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, f"must be <= {maximum:g}, got {value!r}")
    return value


def string(d: Mapping[str, Any], key: str, where: str, default: Any = _MISSING,
           choices: Iterable[str] | None = None) -> Any:
    field = f"{where}.{key}"
    if key not in d or d[key] is None:
        if default is _MISSING:
            raise ConfigError(field, "is required")
        return default
    value = d[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(field, f"must be a non-empty string, got {value!r}")
    if choices is not None and value not in list(choices):
        raise ConfigError(field, f"must be one of {list(choices)}, got {value!r}")
    return value


def boolean(d: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    if key not in d or d[key] is None:
        return default
    if not isinstance(d[key], bool):
        raise ConfigError(f"{where}.{key}", f"must be true or false, got {d[key]!r}")
    return d[key]


def rewrap(exc: ConfigError, where: str, strip: str = "") -> ConfigError:
    """Re-root a ConfigError raised by a dataclass (field ``classes.x.timeout_s``) under ``where``."""
    message = str(exc)[len(exc.field) + 2:]
    field = exc.field[len(strip):] if strip and exc.field.startswith(strip) else exc.field
    return ConfigError(f"{where}.{field}" if field else where, message)
