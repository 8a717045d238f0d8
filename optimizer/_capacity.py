"""Capacity levers: the deployment a trial's knobs describe (device, tensor parallelism, KV and weight precision),
what it costs, whether it can start at all, and -- when no searched config meets the SLOs -- the smallest change
of deployment that would.

A trial's knobs carry the ``gpu`` lever when the study searches devices (``optimizer._knobs.split_deployment``);
``tensor_parallel_size``, ``kv_cache_dtype`` and ``quantization`` are engine knobs.  The price of a deployment is
the device's ``price_per_hour_usd`` (sim/data/hardware.yaml, with its source and date) times the GPUs it uses,
and goes into the trial's metrics under ``objectives.PRICE_KEY`` for the cost objectives.

A combination that cannot start (the weights and one max-length request do not fit the device's memory at that
tensor parallelism and precision, or the tensor parallelism spans more GPUs than one node of the device holds:
its ``gpus_per_node``, 8 unless its price list sells it otherwise, GH200 1, or its ``kv_cache_dtype`` or
``quantization`` is not among the device's ``kv_cache_dtypes`` / ``quantizations``) is *pruned* with its reason -- not
failed, not clipped to something else.  Tensor parallelism is 1, 2, 4 or 8 GPUs (``optimizer._knobs.TP_SIZES``).  FP8 weights on a
device without FP8 tensor cores (A100) are not pruned: vLLM runs them weight-only (FP8 Marlin, vLLM docs
"FP8 W8A8", features/quantization/fp8.md), and the roofline computes at BF16 there.  A study none of whose
trials could start is refused when its spec is read (:func:`check_model_fits`, called by ``optimizer._spec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from objectives import PRICE_KEY
from optimizer._knobs import TP_SIZES, fleet_of, split_deployment
from sim.errors import ConfigError
from sim.profiles import GpuProfile, load_gpu, load_model

if TYPE_CHECKING:
    from optimizer._space import SearchSpace
    from sim.engine.config import EngineConfig

__all__ = ["BUNDLED_LEVERS", "Deployment", "capacity_candidates", "check_model_fits", "deployment_of",
           "fleet_problem", "priced", "precision_problem", "router_deployment", "smallest_change", "startup_problem"]


@dataclass(frozen=True)
class Deployment:
    """Where a config runs: the device, how many of it (tensor parallelism x replicas), the precisions, the
    price per hour (0.0: the device has no price)."""

    gpu: str
    tensor_parallel_size: int
    kv_cache_dtype: str
    quantization: str | None
    replicas: int = 1
    price_per_hour_usd: float = 0.0
    #: The router in front of the replicas (sim.fleet) and its parameters; None: one engine, no router.
    router: str | None = None
    router_params: tuple[tuple[str, Any], ...] = ()

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.replicas

    def describe(self) -> str:
        """``"fp8 KV on 2 x H100-SXM (TP 2), $12.31/h"``."""
        parts = []
        if self.kv_cache_dtype not in ("auto", None):
            parts.append(f"{self.kv_cache_dtype} KV")
        if self.quantization:
            parts.append(f"{self.quantization} weights")
        where = f"{self.gpus} x {self.gpu}" + (f" (TP {self.tensor_parallel_size})" if self.tensor_parallel_size > 1
                                                  else "")
        if self.replicas > 1:
            where = (f"{self.replicas} replicas of " + (f"{self.tensor_parallel_size} x {self.gpu} (TP "
                     f"{self.tensor_parallel_size})" if self.tensor_parallel_size > 1 else f"one {self.gpu}")
                     + (f" behind {self.router}" if self.router else ""))
        elif self.gpus == 1:
            where = f"one {self.gpu}"
        price = f", ${self.price_per_hour_usd:.2f}/h" if self.price_per_hour_usd > 0 else ""
        return (" and ".join(parts) + " on " if parts else "") + where + price

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size, "replicas": self.replicas,
                "gpus": self.gpus, "kv_cache_dtype": self.kv_cache_dtype, "quantization": self.quantization,
                "router": self.router, "router_params": dict(self.router_params),
                "price_per_hour_usd": self.price_per_hour_usd, "description": self.describe()}


def _device(ref: str) -> GpuProfile:
    return load_gpu(ref)


def deployment_of(knobs: Mapping[str, Any], default_gpu: str) -> Deployment:
    """The deployment of a trial's knobs (``gpu`` lever, else ``default_gpu``)."""
    engine, gpu = split_deployment(knobs)
    gpu = gpu or default_gpu
    device = _device(gpu)
    tp = int(engine.get("tensor_parallel_size") or 1)
    replicas, router, params = fleet_of(knobs)
    return Deployment(gpu=device.name if not gpu.endswith((".yaml", ".yml")) else gpu, tensor_parallel_size=tp,
                      kv_cache_dtype=str(engine.get("kv_cache_dtype") or "auto"),
                      quantization=engine.get("quantization") or None, replicas=replicas,
                      price_per_hour_usd=float(device.price_per_hour_usd) * tp * replicas,
                      router=router, router_params=tuple(sorted(params.items())))


def priced(metrics: Mapping[str, Any], knobs: Mapping[str, Any], default_gpu: str) -> dict[str, Any]:
    """``metrics`` with the deployment's price under ``PRICE_KEY`` (left out for a device without a price: a cost
    objective then says the key is missing; study specs refuse that case up front)."""
    out = dict(metrics)
    price = deployment_of(knobs, default_gpu).price_per_hour_usd
    if price > 0:
        out[PRICE_KEY] = price
    return out


def fleet_problem(knobs: Mapping[str, Any]) -> str | None:
    """Why the fleet of ``knobs`` is invalid (an unknown router, a parameter out of its range), or None.  A router
    parameter searched for a router that lacks it is dropped (it does not apply), not an error."""
    from sim.fleet import make_router, router_class

    replicas, router, params = fleet_of(knobs)
    if router is None:
        return None
    own = router_class(router).params
    try:
        make_router(router, {k: v for k, v in params.items() if k in own}, replicas)
    except ConfigError as exc:
        return f"invalid fleet: {exc}"
    return None


def precision_problem(device: GpuProfile, engine: Mapping[str, Any]) -> str | None:
    """Why vLLM cannot start ``engine``'s ``kv_cache_dtype`` or ``quantization`` on ``device`` (not among its
    ``kv_cache_dtypes`` / ``quantizations``), or None."""
    for knob, full, allowed in (("kv_cache_dtype", "auto", device.kv_cache_dtypes),
                                ("quantization", "none", device.quantizations)):
        value = str(engine.get(knob) or full)
        if device.lacks(knob, value):
            return (f"{device.name} lacks {knob} {value} (its {knob}s: {', '.join(allowed)}); vLLM cannot start "
                    f"it there")
    return None


def startup_problem(knobs: Mapping[str, Any], model: str, default_gpu: str,
                    resolved: "EngineConfig | None" = None) -> str | None:
    """Why the deployment of ``knobs`` cannot start (its tensor parallelism spans more than one node of the
    device, its KV or weight precision is one the device lacks, or the weights and one max-length request do
    not fit at its tensor parallelism and precision), or
    None.  Other invalid configs are not this function's business.  ``resolved``: ``knobs``' engine config
    already resolved on their device (the study's check has it), sized here without resolving it again."""
    from sim.engine import size_kv_cache
    from sim.engine.build import size_engine

    engine, gpu = split_deployment(knobs)
    profile = load_model(model)
    device = _device(gpu or default_gpu)
    tp = int(engine.get("tensor_parallel_size") or 1)
    if tp > device.gpus_per_node:
        return (f"cannot start: {profile.name} on {deployment_of(knobs, default_gpu).describe()}: TP {tp} spans "
                f"more GPUs than one {device.name} node holds ({device.gpus_per_node}: its gpus_per_node); tensor "
                f"parallelism runs within one node")
    lacking = precision_problem(device, engine)
    if lacking is not None:
        return f"cannot start: {profile.name} on {deployment_of(knobs, default_gpu).describe()}: {lacking}"
    try:
        if resolved is None:
            size_engine(engine, profile, device)
        else:
            size_kv_cache(profile, device, resolved)
    except ConfigError as exc:
        return (f"cannot start: {profile.name} on {deployment_of(knobs, default_gpu).describe()}: "
                f"{exc.message}")
    return None


#: The bundled range of capacity levers the export tries when no searched config meets the SLOs: each device with
#: a price, one node's tensor-parallel sizes, full and FP8 KV precision (FP8 weights are left out: they change the
#: model, not only its cache).
BUNDLED_LEVERS: dict[str, tuple[Any, ...]] = {
    "gpu": ("L40S", "A100-80GB", "H100-SXM", "H200", "GH200"),
    "tensor_parallel_size": (1, 2, 4, 8),
    "kv_cache_dtype": ("auto", "fp8"),
}
#: At most this many deployments are simulated in the search for the smallest change (cheapest first).
MAX_CAPACITY_TRIES = 12


def capacity_candidates(base: Mapping[str, Any], model: str, default_gpu: str,
                        levers: Mapping[str, tuple[Any, ...]] = BUNDLED_LEVERS) -> list[dict[str, Any]]:
    """``base`` (engine knobs) on every deployment of ``levers`` that can start and has a price, cheapest first
    (at equal price: full precision first, then fewer GPUs), leaving out ``base``'s own deployment."""
    own = deployment_of(base, default_gpu)
    out = []
    for gpu in levers["gpu"]:
        for tp in levers["tensor_parallel_size"]:
            for kv in levers["kv_cache_dtype"]:
                knobs = {**base, "gpu": gpu, "tensor_parallel_size": tp, "kv_cache_dtype": kv}
                dep = deployment_of(knobs, default_gpu)
                if dep.price_per_hour_usd <= 0 or (dep.gpu, dep.tensor_parallel_size, dep.kv_cache_dtype) == (
                        own.gpu, own.tensor_parallel_size, own.kv_cache_dtype):
                    continue
                if startup_problem(knobs, model, default_gpu) is None:
                    out.append(knobs)
    out.sort(key=lambda k: (deployment_of(k, default_gpu).price_per_hour_usd, k["kv_cache_dtype"] != "auto",
                            k["tensor_parallel_size"]))
    return out


def smallest_change(base: Mapping[str, Any], model: str, default_gpu: str, run, meets,
                    levers: Mapping[str, tuple[Any, ...]] = BUNDLED_LEVERS,
                    max_tries: int = MAX_CAPACITY_TRIES) -> dict[str, Any]:
    """The cheapest deployment of ``levers`` on which ``base`` meets every SLO: ``run(knobs) -> metrics`` (None
    when the run failed), ``meets(metrics) -> list of misses`` (empty: every SLO met).  Tries the cheapest
    ``max_tries`` deployments in order; says which it tried and what each missed."""
    tried = []
    for knobs in capacity_candidates(base, model, default_gpu, levers)[:max_tries]:
        dep = deployment_of(knobs, default_gpu)
        metrics = run(knobs)
        misses = ["the run failed"] if metrics is None else [str(m) for m in meets(metrics)]
        tried.append({"deployment": dep.describe(), "misses": misses})
        if not misses:
            return {"found": True, "knobs": dict(knobs), "deployment": dep.to_dict(), "metrics": metrics,
                    "tried": tried}
    return {"found": False, "tried": tried, "levers": {k: list(v) for k, v in levers.items()},
            "max_tries": max_tries}


def router_deployment(dep: Deployment) -> dict[str, Any] | None:
    """How to deploy the fleet of ``dep`` with a real router: ``sglang-router`` (PyPI 0.3.2,
    shared/tools/sglang-router: ``--policy``, ``--cache-threshold``, ``--balance-abs-threshold``,
    ``--balance-rel-threshold``) or vLLM production-stack's router (``--routing-logic roundrobin|session``), when
    one implements the simulated rule; None for one engine without a router."""
    if dep.replicas <= 1 and dep.router is None:
        return None
    router = dep.router or "round_robin"
    params = dict(dep.router_params)
    urls = " ".join(f"http://REPLICA{i}:8000" for i in range(dep.replicas))
    launch = f"python -m sglang_router.launch_router --host 0.0.0.0 --port 30000 --worker-urls {urls}"
    out: dict[str, Any] = {"replicas": dep.replicas, "router": router, "router_params": params}
    if router == "round_robin":
        out["sglang_router"] = f"{launch} --policy round_robin"
        out["production_stack"] = "--routing-logic roundrobin"
    elif router == "sglang_cache_aware":
        flags = "".join(f" --{k.replace('_', '-')} {v:g}" for k, v in sorted(params.items())
                        if k in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"))
        out["sglang_router"] = f"{launch} --policy cache_aware{flags}"
    elif router == "session_affinity":
        out["production_stack"] = "--routing-logic session --session-key <the header that carries the session id>"
    else:
        out["note"] = (f"neither sglang-router nor production-stack implements kvtune's {router} rule; its source "
                       f"(sim/fleet/_routers.py) names the router that does (llm-d's inference scheduler for the "
                       f"KV-utilization and weighted scorers, Dynamo's KV router for dynamo_kv)")
    return out


def check_model_fits(fixed: EngineConfig, search: SearchSpace, model: Any, gpu: Any,
                      gpu_list: list[str] | None = None) -> None:
    """Refuse a study none of whose trials could start: size the KV cache with the most memory the search can
    give it (gpu_memory_utilization, weight and KV dtypes and tensor parallelism at their most generous, the
    tensor parallelism within one node of each device: its ``gpus_per_node``, the KV and weight dtypes among the
    device's ``kv_cache_dtypes`` / ``quantizations``); if even that cannot hold the weights and one max-length
    request on any device searched, every trial would fail.  A study whose fixed or searched dtypes no device of
    it has is one error naming that dtype's field (``engine.kv_cache_dtype``, ``search.quantization``, ...).

    The error names the field to change, and the line names every field involved (model, device, tensor
    parallelism): the tensor parallelism (``tensor_parallel_size`` or ``search.tensor_parallel_size``) when
    another one of one node's (1, 2, 4, 8, up to the device's ``gpus_per_node``) holds the weights on some
    device, saying which; else the device (``gpu``, or ``search.gpu``); a cache that holds the weights but not
    one max-length request, ``engine.max_model_len`` (or the ``num_gpu_blocks_override`` that the spec fixed or
    searched)."""
    from sim.engine.build import size_engine  # resolve and size: whether it fits needs no latency model

    best: dict[str, Any] = {}
    for domain in search.domains:
        if domain.name == "gpu_memory_utilization":
            best["gpu_memory_utilization"] = float(domain.high if domain.high is not None else max(domain.choices))
    searched = search.names
    precisions = {knob: [c or full for c in (search[knob].choices if knob in searched else [getattr(fixed, knob)])]
                  for knob, full in (("kv_cache_dtype", "auto"), ("quantization", "none"))}
    tps = (sorted(int(c) for c in search["tensor_parallel_size"].choices) if "tensor_parallel_size" in searched
           else [fixed.tensor_parallel_size])
    devices = [load_gpu(ref) for ref in search["gpu"].choices] if "gpu" in searched else [gpu]
    config = fixed.replace(**best, **{k: "fp8" if "fp8" in c else c[0] for k, c in precisions.items()})
    tp_field = "search.tensor_parallel_size" if "tensor_parallel_size" in searched else "tensor_parallel_size"
    gpu_field = "search.gpu" if "gpu" in searched and gpu_list is None else "gpu"
    problems: list[tuple[Any, int, str, str, Any]] = []  # (device, TP tried or 0, kind, why, config tried)
    for device in devices:  # the capacity levers: one device that can start some trial is enough
        usable = [t for t in tps if t <= device.gpus_per_node]
        if not usable:
            problems.append((device, 0, "node", f"TP {tps[0]} spans more GPUs than one {device.name} node holds "
                                                f"({device.gpus_per_node}: its gpus_per_node)", config))
            continue
        own = {knob: [c for c in choices if not device.lacks(knob, c)] for knob, choices in precisions.items()}
        lacking = [knob for knob, can in own.items() if not can]
        if lacking:  # every precision the study allows is one the device lacks (its kv_cache_dtypes/quantizations)
            knob = lacking[0]
            problems.append((device, 0, f"precision:{knob}", f"lacks {knob} {', '.join(precisions[knob])} (its "
                             f"{knob}s: {', '.join(getattr(device, knob + 's'))})", config))
            continue
        at_device = config.replace(**{k: "fp8" if "fp8" in c else c[0] for k, c in own.items()})
        try:
            size_engine(at_device.replace(tensor_parallel_size=usable[-1]), model, device)
            return
        except ConfigError as exc:
            why = exc.message.split("; raise ")[0].split("; lower ")[0]
            kind = "weights" if exc.field == "gpu_memory_utilization" else exc.field
            problems.append((device, usable[-1], kind, f"at TP {usable[-1]}: {why}", at_device))
    details = "; ".join(f"on {device.name} {why}" for device, _, _, why, _ in problems)
    if all(kind.startswith("precision:") for _, _, kind, _, _ in problems):
        knob = problems[0][2].split(":")[1]
        field_name = f"search.{knob}" if knob in searched else f"engine.{knob}"
        raise ConfigError(field_name, f"vLLM cannot start {knob} {', '.join(precisions[knob])} on any device of "
                                      f"this study ({field_name}, {gpu_field}): {details}; choose a {knob} the "
                                      f"device has or another {gpu_field}")
    problems = [p for p in problems if not p[2].startswith("precision:")]
    cache = [kind for _, _, kind, _, _ in problems if kind not in ("weights", "node")]
    if cache:  # the weights fit somewhere, one max-length request does not
        field_name = f"search.{cache[0]}" if cache[0] in searched else f"engine.{cache[0]}"
        hint = (f"lower {field_name} (now {config.max_model_len}) or give the cache more memory (a larger "
                f"{tp_field} or {gpu_field})" if cache[0] == "max_model_len" else
                f"give {field_name} enough blocks for one max-length request ({config.max_model_len} tokens)")
        raise ConfigError(field_name, f"{model.name}'s KV cache cannot hold one max-length request on any device "
                                      f"of this study ({field_name}, {gpu_field}, {tp_field}): {details}; {hint}")
    fits_at = []
    for device, tried, _, _, tried_config in problems:
        for size in (s for s in TP_SIZES if tried < s <= device.gpus_per_node):
            try:
                size_engine(tried_config.replace(tensor_parallel_size=size), model, device)
            except ConfigError:
                continue
            fits_at.append(f"TP {size} on {device.name}")
            break
    more = "" if config.quantization == "fp8" else " or FP8 weights (quantization)"
    if fixed.gpu_memory_utilization is not None and "gpu_memory_utilization" not in searched:
        more = f", a higher engine.gpu_memory_utilization (now {fixed.gpu_memory_utilization:g})" + more
    if fits_at:
        field_name = tp_field
        hint = (", ".join(fits_at) + " would hold them: " + ("add it to " if tp_field.startswith("search.") else
                "set ") + f"{tp_field}; else a larger {gpu_field}, a smaller model{more}")
    else:
        field_name = gpu_field
        hint = f"no tensor parallelism within one node holds them: a larger {gpu_field}, a smaller model{more}"
    raise ConfigError(field_name, f"{model.name} cannot start on any device of this study at the tensor "
                                  f"parallelism it allows (model, {gpu_field}, {tp_field}): {details}; {hint}")
