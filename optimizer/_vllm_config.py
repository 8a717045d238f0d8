"""The engine's own config for a trial's knobs: the ``vllm serve --config`` flags of the target vLLM release,
kvtune's own policies that vLLM has no flag for, the notes on what a release cannot express, and the
``recommended.yaml`` text that carries them (``kvtune export`` writes it; ``optimizer/_export.py``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Sequence

import yaml

from optimizer._knobs import KVTUNE_POLICIES, engine_flag_values, split_deployment
from optimizer._spec import StudySpec
from optimizer._versions import VllmTarget, version_validity
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model

__all__ = ["hf_model_id", "render_recommended_yaml", "resolved_config", "target_validity", "vllm_config"]


def hf_model_id(model_name: str) -> str:
    """The Hugging Face repo of a model profile (from its source URL), else its kvtune name."""
    source = load_model(model_name).source
    match = re.search(r"huggingface\.co/([^/\s]+/[^/\s]+)", source)
    return match.group(1) if match else model_name


def _scalar(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else value
    return value


def vllm_config(knobs: Mapping[str, Any], spec: StudySpec, target: VllmTarget | None = None
                ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """``(flags, policies, notes)`` for ``knobs``: the ``vllm serve --config`` mapping for the target version,
    kvtune's own policies that differ from their defaults, and notes on what could not be expressed."""
    target = target or spec.vllm_version
    config = resolved_config(knobs, spec)
    flags: dict[str, Any] = {}
    notes: list[str] = []
    for name, flag, value in engine_flag_values(config):
        if name == "async_scheduling" and config.is_v1 and not target.has_flag(flag):
            # Releases without the flag schedule in lock-step: the same as async_scheduling=false.
            if value:
                notes.append(f"vLLM {target} has no --{flag}; kvtune simulated async scheduling on")
            continue
        if not target.has_flag(flag):
            if name == "scheduler_reserve_full_isl":
                notes.append(f"vLLM {target} has no --{flag}; kvtune simulated it {'on' if value else 'off'}")
            elif (name == "enable_prefix_caching" and not config.is_v1) or (name == "watermark" and not value):
                pass  # the engine's behaviour without the flag is what kvtune simulated
            else:
                notes.append(f"vLLM {target} has no --{flag}; kvtune simulated {name}={value!r}")
            continue
        if isinstance(value, bool) and not value and flag not in target.negatable:
            notes.append(f"--{flag} cannot be turned off by a config file in vLLM {target} (no --no-{flag}); "
                         f"kvtune simulated it off")
            continue
        flags[flag] = _scalar(value)
        if name == "kv_offloading_size_gb" and target.has_flag("kv-offloading-backend"):
            flags["kv-offloading-backend"] = "native"
    policies: dict[str, Any] = {}
    defaults = EngineConfig()
    for name in KVTUNE_POLICIES:
        value = getattr(config, name)
        if value != getattr(defaults, name):
            policies[name] = _scalar(value)
    if "admission_policy" not in policies:
        policies.pop("admission_quantile", None)
        policies.pop("admission_headroom", None)
    if not config.is_v1 and "v1" in target.engines:
        notes.append("this is a V0-engine config: start vLLM with the environment variable VLLM_USE_V1=0")
    validity = target_validity(config, target)
    if validity["differs"]:
        notes.append(f"simulated with vLLM {validity['simulated_release']}'s engine; holds for "
                     f"{', '.join(validity['holds_for']) or 'no listed release'}; differs on "
                     + "; ".join(f"{v} ({', '.join(r)})" for v, r in validity["differs"].items())
                     + " - target one of the releases it holds for, or re-run the study for the others")
    return flags, policies, notes


def resolved_config(knobs: Mapping[str, Any], spec: StudySpec) -> EngineConfig:
    """The engine config ``knobs`` resolve to on their device (the ``gpu`` lever, else the study's)."""
    engine, gpu = split_deployment(knobs)
    return EngineConfig.from_dict(engine, "knobs").resolve(load_model(spec.model).max_model_len,
                                                           load_gpu(gpu or spec.gpu))


def target_validity(config: EngineConfig, target: VllmTarget) -> dict[str, Any]:
    """Which listed releases of ``target`` a recommendation holds for (optimizer/_versions.py version_validity),
    counting only the flags of knobs whose value the engine does not get by default without the flag."""
    silent = {("watermark", False), ("async_scheduling", False), ("enable_prefix_caching", False)}
    knob_flags = frozenset(flag for name, flag, value in engine_flag_values(config)
                           if (name, bool(value)) not in silent and name not in ("tensor_parallel_size",))
    return version_validity(target, knob_flags)


def render_recommended_yaml(flags: Mapping[str, Any], policies: Mapping[str, Any], notes: Sequence[str],
                            header: Sequence[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines.extend(f"# note: {n}" for n in notes)
    body = yaml.safe_dump(dict(flags), sort_keys=False, default_flow_style=False).rstrip("\n")
    lines.append(body)
    lines.append("")
    if policies:
        lines.append("# kvtune_policies:  (kvtune's own policies, simulated in this recommendation; vLLM has no flag for")
        lines.append("#                   them, so enforce them in the gateway/router in front of vLLM)")
        for name, value in policies.items():
            lines.append(f"#   {name}: {json.dumps(value)}")
            lines.append(f"#     rationale: {KVTUNE_POLICIES[name]}")
    else:
        lines.append("# kvtune_policies: none (vLLM's own greedy admission, no reserved KV)")
    return "\n".join(lines) + "\n"
