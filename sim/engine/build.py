"""One way to assemble an engine: resolve its config, size the KV cache, pick the latency model, then make the
core (scheduler flavor and all).  The offline run loop, the digital twin, calibration and the study's start-up
check all go through :func:`resolve_engine` / :func:`build_engine`, so they run the same engine and a trial's
config is resolved, sized and given a latency model once.

:func:`resolve_engine` does the cheap, shareable part (an :class:`EnginePlan`: no mutable state); a plan makes as
many fresh cores as wanted (:meth:`EnginePlan.build`), e.g. one per replica of a fleet.  :func:`build_engine` is
both in one call.  :func:`size_engine` is the first two steps alone (resolve and size, no latency model): the
start-up checks that only ask whether a config fits (``optimizer._capacity``: the spec's ``check_model_fits``
and a trial's ``startup_problem``) use it, and :func:`resolve_engine` is it plus the latency model.

Two places fill a config's defaults with ``EngineConfig.resolve`` alone, on purpose, because they build no
engine: the spec's check of its fixed ``engine:`` section (``optimizer/_spec.py``: vLLM's field rules such as
``max_num_batched_tokens >= max_num_seqs`` on the knobs as written; sizing them would be wrong, since the search
changes the memory knobs and ``check_model_fits`` sizes the most generous config the search allows), and a
calibration's record of the knobs a real server was started with (``replay/calibration/probes.py``: the server
is the engine; the record is re-resolved and built here when ``kvtune calibrate`` fits it).  A study's driver
fills a trial's defaults once to repair and check it (``optimizer._knobs.repair_knobs``, ``check=False``).
``tests/sim/engine/test_engine_build.py`` counts the resolves, sizings and latency models of each path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

from sim.engine.config import EngineConfig
from sim.engine.core import EngineCore, make_scheduler
from sim.engine.scheduler_output import SchedulerOutput
from sim.engine.sizing import KVSizing, size_kv_cache, with_gpu_blocks
from sim.latency import LatencyCoefficients, LatencyModel, RooflineModel, ScaledLatency
from sim.profiles import GpuProfile, ModelProfile


@dataclass(frozen=True)
class EnginePlan:
    """A resolved config with its KV geometry and latency model, on one model and device: everything an engine
    needs except its state.  Made by :func:`resolve_engine`; :meth:`build` makes a fresh engine from it."""

    config: EngineConfig
    sizing: KVSizing
    latency: LatencyModel
    model: ModelProfile
    gpu: GpuProfile

    def scaled(self, kv_scale: float = 1.0, time_scale: float = 1.0) -> "EnginePlan":
        """This plan with its GPU KV blocks times ``kv_scale`` (at least 2, as ``num_gpu_blocks_override``) and
        every step time times ``time_scale`` (:class:`~sim.latency.ScaledLatency`); itself when both are 1."""
        if kv_scale == 1.0 and time_scale == 1.0:
            return self
        config, sizing = self.config, self.sizing
        if kv_scale != 1.0:
            config = config.replace(num_gpu_blocks_override=max(2, int(round(sizing.num_gpu_blocks * kv_scale))))
            sizing = with_gpu_blocks(sizing, config)
        return dataclasses.replace(self, config=config, sizing=sizing,
                                   latency=ScaledLatency(self.latency, time_scale))

    def build(
        self,
        *,
        predicted_output: dict[str, int] | None = None,
        record_steps: bool = True,
        batch_decode_runs: bool = True,
        observer: Callable[[int, float, SchedulerOutput], None] | None = None,
    ) -> "BuiltEngine":
        """A fresh engine core on this plan (its own scheduler and KV blocks; the latency model is shared)."""
        config, latency = self.config, self.latency
        scheduler = make_scheduler(config, self.sizing.num_gpu_blocks, self.sizing.num_cpu_blocks, predicted_output)
        # V0 swap_blocks copies one block per layer for K and V (vLLM paper fig. 19's small-block cost); V1's
        # offload moves a block in one copy.
        scheduler.copies_per_block = 2 * self.model.num_layers if not config.is_v1 else 1
        if scheduler.write_through:
            scheduler.load_time = latency.swap_time  # V1 offload loads are asynchronous (OffloadingConnector)
        core = EngineCore(scheduler, latency, record_steps=record_steps, batch_decode_runs=batch_decode_runs,
                          observer=observer)
        return BuiltEngine(config, self.sizing, latency, core, self)


@dataclass
class BuiltEngine:
    """A resolved config, its KV geometry, its latency model, the core that steps it, and the plan it came from."""

    config: EngineConfig
    sizing: KVSizing
    latency: LatencyModel
    core: EngineCore
    plan: EnginePlan


#: What :func:`resolve_engine` and :func:`build_engine` take as a config: an EngineConfig or its knobs (a mapping
#: of EngineConfig field names, as a trial's parameters are).
ConfigSource = Union[EngineConfig, Mapping[str, Any]]


def roofline_for(config: EngineConfig, model: ModelProfile, gpu: GpuProfile,
                 coefficients: LatencyCoefficients | None = None) -> RooflineModel:
    """The roofline latency model for a resolved config (dtypes, TP, block size taken from it)."""
    return RooflineModel(
        model,
        gpu,
        tensor_parallel=config.tensor_parallel_size,
        kv_dtype_bytes=1 if config.kv_cache_dtype == "fp8" else 2,
        weight_dtype_bytes=1 if config.quantization == "fp8" else 2,
        block_size=config.block_size,
        coefficients=coefficients,
        async_scheduling=bool(config.async_scheduling),
        max_num_seqs=int(config.max_num_seqs or 0),
    )


def resolve_engine(
    config: ConfigSource,
    model: ModelProfile,
    gpu: GpuProfile,
    *,
    latency: LatencyModel | None = None,
    coefficients: LatencyCoefficients | None = None,
) -> EnginePlan:
    """Resolve ``config`` (an EngineConfig or its knobs) for ``model`` on ``gpu``, size its KV cache (ConfigError
    if the model does not fit or the cache cannot hold one max-length request) and pick its latency model:
    ``latency`` if given, else the roofline with ``coefficients``.  Each is done once, here."""
    resolved, sizing = size_engine(config, model, gpu)
    return EnginePlan(resolved, sizing, latency or roofline_for(resolved, model, gpu, coefficients), model, gpu)


def size_engine(config: ConfigSource, model: ModelProfile, gpu: GpuProfile) -> tuple[EngineConfig, KVSizing]:
    """``(resolved config, KV geometry)`` of ``config`` (an EngineConfig or its knobs) for ``model`` on ``gpu``:
    :func:`resolve_engine` without the latency model, for a check of whether the config starts (ConfigError if
    the model does not fit or the cache cannot hold one max-length request)."""
    if not isinstance(config, EngineConfig):
        config = EngineConfig.from_dict(dict(config), "knobs")
    resolved = config.resolve(model.max_model_len, gpu)
    return resolved, size_kv_cache(model, gpu, resolved)


def build_engine(
    config: ConfigSource | EnginePlan,
    model: ModelProfile | None = None,
    gpu: GpuProfile | None = None,
    *,
    latency: LatencyModel | None = None,
    coefficients: LatencyCoefficients | None = None,
    predicted_output: dict[str, int] | None = None,
    record_steps: bool = True,
    batch_decode_runs: bool = True,
    observer: Callable[[int, float, SchedulerOutput], None] | None = None,
) -> BuiltEngine:
    """An engine: :func:`resolve_engine` (unless ``config`` is already an :class:`EnginePlan`, which carries its
    model, device and latency model) and a fresh core from the plan (:meth:`EnginePlan.build`)."""
    if isinstance(config, EnginePlan):
        if latency is not None or coefficients is not None:
            raise ValueError("build_engine: a plan has its latency model; give latency/coefficients to resolve_engine")
        if (model is not None and model is not config.model) or (gpu is not None and gpu is not config.gpu):
            raise ValueError("build_engine: the plan was resolved for another model or device")
        plan = config
    else:
        if model is None or gpu is None:
            raise TypeError("build_engine: a config needs its model and device")
        plan = resolve_engine(config, model, gpu, latency=latency, coefficients=coefficients)
    return plan.build(predicted_output=predicted_output, record_steps=record_steps,
                      batch_decode_runs=batch_decode_runs, observer=observer)


__all__ = ["BuiltEngine", "ConfigSource", "EnginePlan", "build_engine", "resolve_engine", "roofline_for", "size_engine"]
