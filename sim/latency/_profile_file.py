"""Latency profile files: fitted coefficients for one model on one device (``kvtune calibrate`` writes them).

YAML: ``{kind: kvtune-latency-profile, model, gpu, coefficients: {...LatencyCoefficients fields}, fitted: [...],
fit: {...}}``, or a plain mapping of coefficients.  ``simulate``, ``tune`` (a spec's ``latency_profile``) and
``twin`` read them with :func:`load_profile`; ``model`` and ``gpu`` name what the coefficients were fitted for
(a profile name, or the path of an HF ``config.json`` / device YAML) and are the defaults where a command is
given the profile but no model or device.

``fit.client_latency.offset_s`` is what a client sees beyond the engine (HTTP, the API server, the first chunk),
measured or fitted by ``kvtune calibrate``; :func:`add_client_latency` adds it to a simulated request table, as
``kvtune simulate --profile`` and the real-engine benchmark do (:attr:`LatencyProfile.client_offset_s`).

``device`` (written by ``kvtune calibrate`` since issue 32) records the machine the probes ran on
(:func:`machine_device`: the GPU's name and driver, or the CPU's model and the cores the process may use); a
profile read on another machine warns once, naming both (the coefficients are that machine's speed).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ConfigError
from sim.fields import at, check_keys, fail, file_error, in_file, one_of
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
    #: Seconds a client sees beyond the engine, added to every token (``fit.client_latency.offset_s``; 0 if none).
    client_offset_s: float = 0.0


def add_client_latency(requests, offset_s: float):
    """A simulated request table (a DataFrame) as a client would see it: every token ``offset_s`` later (TTFT,
    E2E, first-token and end times grow by it; TPOT does not change).  The table itself when ``offset_s`` is 0."""
    if not offset_s:
        return requests
    out = requests.copy()
    for col in ("first_token_s", "end_s", "ttft_s", "e2e_s"):
        if col in out.columns:
            out[col] = out[col] + offset_s
    return out


#: What :func:`with_client_timeouts` leaves of a timeout at least (a class's timeout must stay positive).
MIN_CLIENT_TIMEOUT_S = 1e-3


def with_client_timeouts(workload, offset_s: float):
    """``workload`` as the engine serves it for clients that see every token ``offset_s`` later
    (:func:`add_client_latency`): each class's client timeout shortened by ``offset_s`` (at least
    :data:`MIN_CLIENT_TIMEOUT_S` left).  A request the simulation then finishes is one whose client, seeing its last
    token ``offset_s`` later, had not given up (a finished request's client-side E2E never exceeds its timeout), and
    one the client gave up on frees its KV blocks when the client's deadline reaches the engine.  The workload
    itself when ``offset_s`` is 0 or no class has a timeout."""
    classes = getattr(workload, "classes", None) or {}
    if not offset_s or not any(c.timeout_s is not None for c in classes.values()):
        return workload
    shortened = {name: c if c.timeout_s is None else
                 dataclasses.replace(c, timeout_s=max(MIN_CLIENT_TIMEOUT_S, c.timeout_s - offset_s))
                 for name, c in classes.items()}
    return dataclasses.replace(workload, classes=shortened)


def _client_offset(data: dict, path: Path) -> float:
    """``fit.client_latency.offset_s`` of a profile document (0 when absent); a bad value is a ConfigError."""
    fit = data.get("fit")
    client = fit.get("client_latency") if isinstance(fit, dict) else None
    value = client.get("offset_s", 0.0) if isinstance(client, dict) else 0.0
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= float(value) < math.inf):
        raise fail("fit.client_latency.offset_s", "a number of seconds >= 0", value)
    return float(value)


#: Coefficients whose default is 0 (a term only some engines have): 0 is a value, not a missing one.
_MAY_BE_ZERO = frozenset({"per_prefill_seq_overhead_s", "per_seq_slot_overhead_s"})


def coefficients_from_mapping(values: dict, where: str = "coefficients") -> LatencyCoefficients:
    """LatencyCoefficients from a mapping (values numbers, or their text from ``--coef NAME=VALUE``); unknown names
    and non-positive values are errors naming the field."""
    check_keys(values, _FIELDS, where, what="latency coefficient")
    out = {}
    for key, value in values.items():
        if isinstance(value, bool):
            raise fail(at(where, key), "a number", value)
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            raise fail(at(where, key), "a number", value) from None
        if key in _MAY_BE_ZERO and value == 0:
            pass  # a term the model may leave out (its default)
        elif not (value > 0 and (math.isfinite(value) or key == "roofline_norm")):
            raise fail(at(where, key), "a positive number", value)
        out[key] = value
    return LatencyCoefficients(**out)


class DeviceMismatchWarning(UserWarning):
    """A latency profile is read on a machine other than the one its probes ran on."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[str, str, int] | None:
    """(name, driver, count) of this machine's NVIDIA GPUs from ``nvidia-smi``; None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
    if not rows:
        return None
    return rows[0][0], (rows[0][1] if len(rows[0]) > 1 else ""), len(rows)


def machine_device(gpu: bool = True) -> dict:
    """This machine as a profile records it: ``{kind: gpu, name, driver, count}`` when ``nvidia-smi`` lists a GPU
    (and ``gpu``), else ``{kind: cpu, name: CPU model, cores: usable cores (sched_getaffinity), cpu_count}``."""
    found = _gpus() if gpu else None
    if found is not None:
        name, driver, count = found
        return {"kind": "gpu", "name": name, "driver": driver, "count": count}
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {"kind": "cpu", "name": _cpu_model(), "cores": int(usable), "cpu_count": int(os.cpu_count() or usable)}


def describe_device(device: dict | None) -> str:
    """One line for a recorded device (``machine_device``'s form)."""
    if not device:
        return "an unrecorded device"
    if device.get("kind") == "gpu":
        count = int(device.get("count", 1) or 1)
        driver = f", driver {device['driver']}" if device.get("driver") else ""
        return f"{count} x {device.get('name')}{driver}" if count > 1 else f"{device.get('name')}{driver}"
    return f"{device.get('name')} ({device.get('cores')} usable of {device.get('cpu_count')} cores)"


def same_device(a: dict, b: dict) -> bool:
    """Whether two recorded devices are the same kind of machine for the coefficients: the GPU name and count, or
    the CPU model and usable cores (a driver update or a bigger host is not another device)."""
    if a.get("kind") != b.get("kind"):
        return False
    if a.get("kind") == "gpu":
        return (a.get("name"), int(a.get("count", 1) or 1)) == (b.get("name"), int(b.get("count", 1) or 1))
    return (a.get("name"), a.get("cores")) == (b.get("name"), b.get("cores"))


_WARNED: set[tuple[str, str]] = set()


def check_device(recorded: dict | None, where: str = "profile", current: dict | None = None) -> str | None:
    """Warn once (``DeviceMismatchWarning``) when ``recorded`` (a profile's ``device``) is not this machine;
    returns the message, None when they match or nothing was recorded.  A GPU profile read on a machine without
    a GPU is not checked: simulating a device one does not have is what profiles are for."""
    if not isinstance(recorded, dict) or not recorded.get("kind"):
        return None
    if current is None:
        current = machine_device(gpu=recorded.get("kind") == "gpu")
        if recorded.get("kind") == "gpu" and current.get("kind") != "gpu":
            return None
    if same_device(recorded, current):
        return None
    message = (f"{where}: fitted on {describe_device(recorded)}, read on {describe_device(current)}: its "
               f"coefficients are the speed of the device it was fitted on")
    key = (describe_device(recorded), describe_device(current))
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, DeviceMismatchWarning, stacklevel=3)
    return message


def read_profile(path: str | Path) -> LatencyProfile:
    """A profile file (``kvtune calibrate`` output, or a plain mapping of coefficients)."""
    path = Path(path).expanduser()
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise file_error(path, f"must be a mapping (kind:, coefficients:, ...), got {type(data).__name__}")
    try:
        return _profile(data, path)
    except ConfigError as exc:
        raise in_file(exc, path) from None


def _profile(data: dict, path: Path) -> LatencyProfile:
    if "coefficients" in data or data.get("kind") == PROFILE_KIND:
        one_of("kind", data.get("kind", PROFILE_KIND), (PROFILE_KIND,))
        values = data.get("coefficients")
        model, gpu = data.get("model"), data.get("gpu")
        for key, value in (("model", model), ("gpu", gpu)):
            if value is not None and not isinstance(value, str):
                raise fail(key, "a string", value)
        check_device(data.get("device"), where=str(path))
        client_offset_s = _client_offset(data, path)
    else:
        values, model, gpu, client_offset_s = data, None, None, 0.0
    if not isinstance(values, dict):
        raise fail("coefficients", "a mapping", values)
    return LatencyProfile(coefficients_from_mapping(values, where="coefficients"), model or None,
                          gpu or None, str(path), client_offset_s)


def load_profile(path: str | Path) -> LatencyCoefficients:
    """The coefficients of a profile file."""
    return read_profile(path).coefficients


__all__ = ["DeviceMismatchWarning", "LatencyProfile", "PROFILE_KIND", "add_client_latency", "check_device",
           "coefficients_from_mapping", "describe_device", "load_profile", "machine_device", "read_profile",
           "same_device"]
