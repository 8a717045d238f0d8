"""One way to assemble an engine from a config: resolve it, size the KV cache, pick the latency model and the
scheduler flavor.  The offline run loop and the digital twin both call this, so they run the same engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sim.engine.config import EngineConfig
from sim.engine.core import EngineCore, make_scheduler
from sim.engine.scheduler_base import SchedulerOutput
from sim.engine.sizing import KVSizing, size_kv_cache
from sim.latency import LatencyCoefficients, LatencyModel, RooflineModel
from sim.profiles import GpuProfile, ModelProfile


@dataclass
class BuiltEngine:
    """A resolved config, its KV geometry, and the core that steps it."""

    config: EngineConfig
    sizing: KVSizing
    latency: LatencyModel
    core: EngineCore


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
    )


def build_engine(
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    *,
    latency: LatencyModel | None = None,
    coefficients: LatencyCoefficients | None = None,
    predicted_output: dict[str, int] | None = None,
    record_steps: bool = True,
    batch_decode_runs: bool = True,
    observer: Callable[[int, float, SchedulerOutput], None] | None = None,
) -> BuiltEngine:
    """Resolve ``config`` for ``model``, size its KV cache on ``gpu`` (ConfigError if it cannot hold one
    max-length request) and build the engine core."""
    resolved = config.resolve(model.max_model_len, gpu)
    sizing = size_kv_cache(model, gpu, resolved)
    latency = latency or roofline_for(resolved, model, gpu, coefficients)
    scheduler = make_scheduler(resolved, sizing.num_gpu_blocks, sizing.num_cpu_blocks, predicted_output)
    # V0 swap_blocks copies one block per layer for K and V (vLLM paper fig. 19's small-block cost); V1's
    # offload moves a block in one copy.
    scheduler.copies_per_block = 2 * model.num_layers if not resolved.is_v1 else 1
    if scheduler.write_through:
        scheduler.load_time = latency.swap_time  # V1 offload loads are asynchronous (OffloadingConnector)
    core = EngineCore(scheduler, latency, record_steps=record_steps, batch_decode_runs=batch_decode_runs, observer=observer)
    return BuiltEngine(resolved, sizing, latency, core)
