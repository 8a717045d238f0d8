"""Engine knobs as the optimizer sees them: which are vLLM flags (and which flag), which are kvtune's own.

The optimizer works on :class:`sim.engine.config.EngineConfig` field names.  One extra, *virtual* knob exists for
``vllm-v1``: ``preemption_mode`` with choices ``recompute`` / ``offload``, where ``offload`` means a CPU KV tier
(``kv_offloading_size_gb > 0``, vLLM's ``--kv-offloading-size``).  For ``vllm-v0`` ``preemption_mode`` is the real
``--preemption-mode`` (``recompute`` / ``swap``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from sim.engine.config import V0_ONLY, V1_ONLY, EngineConfig
from sim.errors import ConfigError

#: EngineConfig field -> ``vllm serve`` flag (without ``--``).
VLLM_FLAGS: dict[str, str] = {
    "max_num_seqs": "max-num-seqs",
    "max_num_batched_tokens": "max-num-batched-tokens",
    "gpu_memory_utilization": "gpu-memory-utilization",
    "block_size": "block-size",
    "kv_cache_dtype": "kv-cache-dtype",
    "quantization": "quantization",
    "tensor_parallel_size": "tensor-parallel-size",
    "max_model_len": "max-model-len",
    "scheduling_policy": "scheduling-policy",
    "enable_prefix_caching": "enable-prefix-caching",
    "watermark": "watermark",
    "scheduler_reserve_full_isl": "scheduler-reserve-full-isl",
    "long_prefill_token_threshold": "long-prefill-token-threshold",
    "kv_offloading_size_gb": "kv-offloading-size",
    "preemption_mode": "preemption-mode",
    "swap_space_gb": "swap-space",
    "enable_chunked_prefill": "enable-chunked-prefill",
    "num_gpu_blocks_override": "num-gpu-blocks-override",
    "async_scheduling": "async-scheduling",
}

#: kvtune's own policies (no vLLM flag): why an operator would apply each, for the export.
KVTUNE_POLICIES: dict[str, str] = {
    "reserved_kv_fraction": (
        "share of GPU KV blocks that only already-running sequences may grow into, so new admissions cannot "
        "starve running requests into preemption; enforce it in an admission gateway (e.g. cap in-flight prompt "
        "tokens at (1 - fraction) of the KV capacity)"),
    "admission_policy": (
        "'predicted' admits a request only if its prompt plus its class's predicted output length fits in free "
        "KV memory; vLLM admits greedily, so apply this in the router/gateway in front of vLLM"),
    "admission_quantile": "quantile of each class's output length that predicted admission assumes",
    "admission_headroom": "share of KV blocks that must remain free after a predicted admission",
}

#: Study-level settings that are not engine knobs.
TOP_LEVEL = ("flavor", "tensor_parallel_size", "engine_version")
#: Capacity levers: deployment settings a study may search beside the engine knobs (``search: {gpu: [...],
#: tensor_parallel_size: [1, 2]}``; a top-level ``gpu:`` list searches the devices too).  ``gpu`` is not an engine
#: knob: a trial's knobs carry it (:func:`split_deployment`) and the backend runs the engine on that device.
CAPACITY_LEVERS = ("gpu", "tensor_parallel_size", "replicas", "router")
#: Search keys ``router.<param>`` set a router's parameter (sim.fleet: each router's ``params``).
ROUTER_PARAM = "router."
#: Most replicas a study may search or fix.
MAX_REPLICAS = 1024
#: Tensor-parallel sizes kvtune simulates (one node).
TP_SIZES = (1, 2, 4, 8)

VIRTUAL_PREEMPTION = "preemption_mode"
V1_PREEMPTION_CHOICES = ("recompute", "offload")
V0_PREEMPTION_CHOICES = ("recompute", "swap")

_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}


def knob_names() -> list[str]:
    return [name for name in _FIELDS if name not in TOP_LEVEL]


def is_lever(name: str) -> bool:
    """A capacity lever (device, TP, replicas, router) or a router parameter (``router.<param>``)."""
    return name in CAPACITY_LEVERS or name.startswith(ROUTER_PARAM)


def field_type(name: str) -> str:
    """``int``, ``float``, ``bool`` or ``str`` for an EngineConfig field (the virtual knob is ``str``) or a lever."""
    if name == "replicas":
        return "int"
    if name.startswith(ROUTER_PARAM):
        return "float"
    if name not in _FIELDS:
        return "str"
    kind = str(_FIELDS[name].type)
    for base in ("bool", "int", "float"):
        if kind.startswith(base):
            return base
    return "str"


def check_knob(name: str, flavor: str, target: Any, where: str, *, searched: bool = False) -> None:
    """Raise ConfigError (at ``where``) if ``name`` is no knob of ``flavor``, or a vLLM flag ``target`` lacks."""
    if searched and is_lever(name):
        return
    if name in TOP_LEVEL or name == "gpu":
        raise ConfigError(where, f"{name} is set at the top level of the study (or searched as a capacity lever "
                                 f"under search:), not as an engine knob")
    if name not in _FIELDS and not (name == VIRTUAL_PREEMPTION):
        from sim.fields import unknown

        raise unknown(where, name, knob_names(), "engine knob")
    other_only = V0_ONLY if flavor == "vllm-v1" else V1_ONLY
    if name in other_only and not (flavor == "vllm-v1" and name == VIRTUAL_PREEMPTION and searched):
        raise ConfigError(where, f"is not a knob of {flavor} (it exists only in the other flavor)")
    if flavor == "vllm-v1" and name == VIRTUAL_PREEMPTION:
        name = "kv_offloading_size_gb"
    flag = VLLM_FLAGS.get(name)
    if flag is not None and target is not None and not target.has_flag(flag):
        raise ConfigError(where, f"vLLM {target} has no --{flag} flag (per optimizer/data/vllm_flags.yaml: "
                                 f"{', '.join(target.sources())})")


def params_to_knobs(params: Mapping[str, Any], flavor: str) -> dict[str, Any]:
    """Search-space parameters -> EngineConfig knobs (the v1 virtual ``preemption_mode`` becomes the offload size)."""
    knobs = dict(params)
    if flavor == "vllm-v1" and VIRTUAL_PREEMPTION in knobs:
        mode = knobs.pop(VIRTUAL_PREEMPTION)
        if mode != "offload":
            knobs.pop("kv_offloading_size_gb", None)
    if flavor == "vllm-v0" and knobs.get("preemption_mode") == "recompute":
        knobs.pop("swap_space_gb", None)
    return knobs


def repair_knobs(knobs: Mapping[str, Any], searched: Any, model_max_len: int, device: Any = None
                 ) -> tuple[dict[str, Any], str | None, EngineConfig | None]:
    """Make a drawn config one vLLM accepts, say what changed, and hand on its engine config with every default
    filled in (``EngineConfig.resolve(check=False)``: the trial's one resolve before it runs, which the study's
    check takes as it is; None where the engine knobs do not make a config).  A trial's deployment levers
    (``gpu``, ``replicas``, ``router``, ``router.<param>``: :func:`split_deployment`) are set aside for the repair
    and handed back as drawn; ``device`` is the one the ``gpu`` lever names.

    Every vLLM release refuses ``max_num_batched_tokens < max_num_seqs`` (``SchedulerConfig``: "must be greater than
    or equal to max_num_seqs").  A draw that breaks it gets the searched one of the two moved to the other: fewer
    sequences (a step cannot decode more sequences than its token budget anyway), or a larger budget when only the
    budget is searched.  Other invalid draws are left for the caller to fail.
    """
    out = dict(knobs)
    engine, _ = split_deployment(out)  # the levers are no EngineConfig fields: from_dict would refuse them
    try:
        # The budget and sequences the engine would use (without the start-up rules: this very rule would raise).
        filled = EngineConfig.from_dict(engine, "knobs").resolve(model_max_len, device, check=False)
    except ConfigError:
        return out, None, None
    budget, seqs = filled.max_num_batched_tokens, filled.max_num_seqs
    if budget is None or budget >= seqs:
        return out, None, filled
    # Neither knob's default depends on the other (sim.engine.defaults), so the repaired config is this one with the
    # knob moved.
    if "max_num_seqs" in searched:
        out["max_num_seqs"] = int(budget)
        return out, (f"max_num_seqs {seqs} -> {budget}: vLLM requires max_num_batched_tokens ({budget}) >= "
                     "max_num_seqs"), filled.replace(max_num_seqs=int(budget))
    if "max_num_batched_tokens" in searched:
        out["max_num_batched_tokens"] = int(seqs)
        return out, (f"max_num_batched_tokens {budget} -> {seqs}: vLLM requires max_num_batched_tokens >= "
                     f"max_num_seqs ({seqs})"), filled.replace(max_num_batched_tokens=int(seqs))
    return out, None, filled


def engine_flag_values(config: Any):
    """``(knob, flag, value)`` for every vLLM flag a resolved EngineConfig sets: knobs of the other flavor,
    unset values, ``quantization: none``, zero offload/threshold and swap space without swap preemption are
    left out.  Export (which notes what a target lacks) and replay (which refuses it) share this walk."""
    from sim.engine.config import V0_ONLY, V1_ONLY

    flavor_lacks = V0_ONLY if config.is_v1 else V1_ONLY
    for name, flag in VLLM_FLAGS.items():
        if name in flavor_lacks:
            continue
        value = getattr(config, name)
        if value is None:
            continue
        if name == "quantization" and value == "none":
            continue
        if name in ("kv_offloading_size_gb", "long_prefill_token_threshold") and not value:
            continue
        if name == "swap_space_gb" and config.preemption_mode != "swap":
            continue
        yield name, flag, value


def split_deployment(knobs: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``(engine knobs, device)``: a trial's knobs without the deployment levers (``gpu``, ``replicas``,
    ``router``, ``router.<param>``: :func:`fleet_of` reads those), and the device it names (None: the study's)."""
    out = {k: v for k, v in knobs.items() if not (k in ("gpu", "replicas", "router") or k.startswith(ROUTER_PARAM))}
    return out, knobs.get("gpu")


def fleet_of(knobs: Mapping[str, Any]) -> tuple[int, str | None, dict[str, Any]]:
    """``(replicas, router, router params)`` of a trial's knobs: one engine and no router unless they say."""
    params = {k[len(ROUTER_PARAM):]: v for k, v in knobs.items() if k.startswith(ROUTER_PARAM)}
    return int(knobs.get("replicas") or 1), knobs.get("router"), params
