"""Typed GPU and model profiles.

The figures (with their sources) live in ``sim/data/hardware.yaml`` and ``sim/data/models.yaml`` so that an
installed package needs nothing outside itself.  Names are matched exactly, then through each entry's
aliases, case-insensitively.

Wherever a name is taken, a path works too: ``load_model`` reads a Hugging Face ``config.json`` (the file or its
model folder, :mod:`sim.profiles._hf`), ``load_gpu`` a device YAML (:func:`load_device_yaml`: a CPU engine, a GPU
kvtune does not list).
"""

from __future__ import annotations

import datetime
import functools
import re
from dataclasses import fields
from importlib import resources
from pathlib import Path

from sim.errors import ConfigError
from sim.fields import at, check_keys, fail, file_error, in_file, integer, number, string, to_string
from sim.profiles._types import GpuProfile, ModelProfile
from sim.safe_yaml import read_package_yaml, read_yaml


def _load_yaml(filename: str) -> dict:
    return read_package_yaml("sim", "data", filename)


def _index(filename: str, section: str, cls: type) -> dict:
    """Profiles of one data file, keyed by lower-cased name and every alias."""
    table = {}
    names = {f.name for f in fields(cls)}
    for entry in _load_yaml(filename)[section]:
        entry = {k: tuple(v) if k in ("kv_cache_dtypes", "quantizations") else v for k, v in dict(entry).items()}
        aliases = entry.pop("aliases", []) or []
        profile = cls(**{k: v for k, v in entry.items() if k in names})
        for key in [profile.name, *aliases]:
            table[key.lower()] = profile
    return table


@functools.cache
def _gpus() -> dict[str, GpuProfile]:
    table = _index("hardware.yaml", "gpus", GpuProfile)
    # Devices shipped as device YAMLs (sim/profiles/devices: the vllm-cpu engine's CPU), by name and alias.
    for entry in sorted(resources.files("sim").joinpath("profiles", "devices").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            profile = _device(str(entry))
            aliases = (read_package_yaml("sim", "profiles", "devices", entry.name) or {}).get("aliases") or []
            for key in [profile.name, *aliases]:
                table.setdefault(key.lower(), profile)
    return table


@functools.cache
def _models() -> dict[str, ModelProfile]:
    return _index("models.yaml", "models", ModelProfile)


def gpu_names() -> list[str]:
    return sorted({p.name for p in _gpus().values()})


def model_names() -> list[str]:
    return sorted({p.name for p in _models().values()})


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.startswith(".") or name.endswith((".yaml", ".yml", ".json")) or Path(name).exists()


def load_gpu(name: str, field: str = "gpu") -> GpuProfile:
    """A built-in GPU by name or alias, or a device YAML by path (:func:`load_device_yaml`)."""
    if isinstance(name, GpuProfile):
        return name
    try:
        return _gpus()[name.lower()]
    except KeyError:
        if _looks_like_path(name):
            return load_device_yaml(name)
        raise ConfigError(field, f"unknown GPU {name!r}; known: {', '.join(gpu_names())}, or the path of a device "
                                 f"YAML") from None


def load_model(name: str, field: str = "model") -> ModelProfile:
    """A built-in model by name or alias, or a Hugging Face ``config.json`` (or its folder) by path."""
    if isinstance(name, ModelProfile):
        return name
    try:
        return _models()[name.lower()]
    except KeyError:
        if _looks_like_path(name):
            from sim.profiles._hf import model_from_hf_config

            return model_from_hf_config(name)
        raise ConfigError(field, f"unknown model {name!r}; known: {', '.join(model_names())}, or a Hugging Face "
                                 f"model folder / config.json") from None


#: Device YAML keys: required (peak compute, memory bandwidth, memory, host link) and optional with defaults.
_DEVICE_REQUIRED = ("mem_gb", "hbm_bw_gbps", "bf16_tflops", "host_link_gbps")
_DEVICE_OPTIONAL = {"name": None, "fp8_tflops": None, "gpu_link_gbps": None, "price_per_hour_usd": 0.0,
                    "source": None, "price_source": None, "price_date": None, "gpus_per_node": 8,
                    "kv_cache_dtypes": ("auto", "fp8"), "quantizations": ("none", "fp8"), "kind": None}
#: What a device YAML's ``kind`` may say.
_DEVICE_KINDS = ("cpu", "gpu")
_PRICE_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$")


def _price_strings(data: dict) -> dict:
    """``price_source`` and ``price_date`` of a device YAML: strings, the date ``YYYY-MM`` or ``YYYY-MM-DD`` (an
    unquoted YAML date, which the parser reads as a date, is taken as its ISO text)."""
    date = data.get("price_date")
    if isinstance(date, datetime.date) and not isinstance(date, datetime.datetime):
        date = date.isoformat()
    date = string({"price_date": date}, "price_date", "", None)
    if date is not None and not _PRICE_DATE.match(date):
        raise fail("price_date", "a date YYYY-MM or YYYY-MM-DD", date)
    return {"price_source": string(data, "price_source", "", None), "price_date": date}


@functools.cache
def _device(path: str) -> GpuProfile:
    data = read_yaml(path)  # no aliases, bounded size and nesting: a hostile device YAML is one error line
    if isinstance(data, dict) and isinstance(data.get("gpus"), list) and len(data["gpus"]) == 1:
        data = data["gpus"][0]  # hardware.yaml's layout with one entry
    if not isinstance(data, dict):
        raise file_error(path, "must be a mapping of device fields (mem_gb, hbm_bw_gbps, bf16_tflops, "
                               "host_link_gbps, ...)")
    try:
        return _device_fields(data, path)
    except ConfigError as exc:
        raise in_file(exc, path) from None


def _precisions(data: dict, key: str, full: str) -> tuple[str, ...]:
    """``kv_cache_dtypes`` / ``quantizations`` of a device YAML: a list of the engine's values that includes the
    full-precision one (``auto`` / ``none``); absent, all of them."""
    allowed = _DEVICE_OPTIONAL[key]
    value = data.get(key)
    if value is None:
        return allowed
    if not isinstance(value, list) or not value:
        raise fail(key, f"a non-empty list of {list(allowed)}", value)
    out = tuple(to_string(at(key, i), item, allowed) for i, item in enumerate(value))
    if full not in out:
        raise fail(key, f"a list that includes {full!r} (full precision)", value)
    return out


def _device_fields(data: dict, path: str) -> GpuProfile:
    check_keys(data, (*_DEVICE_REQUIRED, *_DEVICE_OPTIONAL, "aliases"), "", what="field")
    for key in _DEVICE_REQUIRED:
        if data.get(key) is None:
            raise ConfigError(key, "is required (a device needs mem_gb, hbm_bw_gbps, bf16_tflops and host_link_gbps)")
    values: dict = {key: number(data, key, "", positive=True) for key in _DEVICE_REQUIRED}
    for key in ("fp8_tflops", "gpu_link_gbps", "price_per_hour_usd"):
        values[key] = number(data, key, "", _DEVICE_OPTIONAL[key], minimum=0.0)
    if values["gpu_link_gbps"] is None:
        values["gpu_link_gbps"] = values["host_link_gbps"]  # no peer link: tensor parallelism goes over the host
    values["gpus_per_node"] = integer(data, "gpus_per_node", "", _DEVICE_OPTIONAL["gpus_per_node"], minimum=1,
                                      maximum=1024)
    for key, full in (("kv_cache_dtypes", "auto"), ("quantizations", "none")):
        values[key] = _precisions(data, key, full)
    name = string(data, "name", "", Path(path).stem)
    kind = data.get("kind")
    if kind is not None and kind not in _DEVICE_KINDS:
        raise ConfigError("kind", f"{kind!r} is not one of {', '.join(_DEVICE_KINDS)}")
    source = data.get("source") or path
    return GpuProfile(name=name, source=str(source), kind=kind, **values, **_price_strings(data))


def load_device_yaml(path: str | Path) -> GpuProfile:
    """A device from a YAML file with hardware.yaml's fields: ``mem_gb`` (memory, GB), ``hbm_bw_gbps`` (memory
    bandwidth, GB/s), ``bf16_tflops`` (peak dense compute, TFLOP/s) and ``host_link_gbps`` (host<->device, GB/s),
    required; ``name``, ``fp8_tflops``, ``gpu_link_gbps`` (default host_link_gbps), ``price_per_hour_usd`` (USD per
    GPU-hour; 0.0, the default, means unknown), ``price_source`` and ``price_date`` (strings: where and when the
    price was read, ``YYYY-MM[-DD]``), ``gpus_per_node`` (the most tensor parallelism spans; default 8),
    ``kv_cache_dtypes`` and ``quantizations`` (lists: what vLLM starts with on the device; default all, ``[auto,
    fp8]`` and ``[none, fp8]``), ``kind`` (``cpu`` or ``gpu``; default: ``cpu`` when the name has the word cpu),
    ``source``, optional.  ConfigError naming the file and field for a bad
    one."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise file_error(path, "no such device YAML")
    return _device(str(p.resolve()))
