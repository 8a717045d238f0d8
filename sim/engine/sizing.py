"""How many KV blocks fit: vLLM's memory profiling, in closed form.

``num_gpu_blocks = (gpu_mem * gpu_memory_utilization - weights - activation_peak) // block_bytes``
(vllm/worker/worker.py determine_num_available_blocks in 0.8.5; vllm/v1/worker/gpu_worker.py in V1).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.profiles import GpuProfile, ModelProfile

GIB = 1024**3


@dataclass(frozen=True)
class KVSizing:
    """The KV-cache geometry a config gets on a GPU."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: float
    kv_bytes_per_token: float
    weight_bytes: float
    activation_bytes: float


def activation_peak_bytes(model: ModelProfile, config: EngineConfig) -> float:
    """Peak non-KV memory of the profiling forward pass, per GPU.

    vLLM profiles one forward of ``max_num_batched_tokens`` tokens; the peak is dominated by the MLP
    intermediate and the logits of ``max_num_seqs`` sequences (fp32), plus CUDA graphs and the allocator's
    slack (about 1 GiB in practice).
    """
    tp = config.tensor_parallel_size
    tokens = config.max_num_batched_tokens or 8192
    mlp = tokens * (2 * model.intermediate_size / tp + 4 * model.hidden_size) * 2
    logits = config.max_num_seqs * model.vocab_size * 4
    return mlp + logits + 1.0 * GIB


def size_kv_cache(model: ModelProfile, gpu: GpuProfile, config: EngineConfig) -> KVSizing:
    """Blocks for a resolved config; raises ConfigError when the model does not fit or cannot hold one
    max-length request (vLLM refuses to start then too)."""
    tp = config.tensor_parallel_size
    kv_dtype_bytes = 1 if config.kv_cache_dtype == "fp8" else 2
    weight_dtype_bytes = 1 if config.quantization == "fp8" else 2
    kv_per_token = model.kv_bytes_per_token(kv_dtype_bytes, tp)
    block_bytes = config.block_size * kv_per_token
    weights = model.params * weight_dtype_bytes / tp
    activation = activation_peak_bytes(model, config)
    if config.num_gpu_blocks_override is not None:
        num_gpu_blocks = config.num_gpu_blocks_override
    else:
        budget = gpu.mem_bytes * config.gpu_memory_utilization - weights - activation
        if budget <= 0:
            raise ConfigError(
                "gpu_memory_utilization",
                f"{model.name} needs {weights / 1e9:.1f} GB of weights per GPU (+{activation / 1e9:.1f} GB activations) "
                f"but {gpu.name} x{config.gpu_memory_utilization} gives {gpu.mem_bytes * config.gpu_memory_utilization / 1e9:.1f} GB; "
                "raise tensor_parallel_size or gpu_memory_utilization",
            )
        num_gpu_blocks = int(budget // block_bytes)
    swap_gb = config.swap_space_gb if config.flavor == "vllm-v0" and config.preemption_mode == "swap" else 0.0
    offload_gb = config.kv_offloading_size_gb or 0.0
    num_cpu_blocks = int((swap_gb + offload_gb) * GIB // block_bytes)
    # Block 0 is vLLM V1's null block; V0 has none.
    usable = num_gpu_blocks - 1 if config.is_v1 else num_gpu_blocks
    max_len = config.max_model_len
    if usable * config.block_size < max_len:
        field = "num_gpu_blocks_override" if config.num_gpu_blocks_override is not None else "max_model_len"
        raise ConfigError(
            field,
            f"the KV cache holds {usable * config.block_size} tokens ({usable} blocks of {config.block_size}) "
            f"but one max-length request needs {max_len}; lower max_model_len or give the cache more memory",
        )
    return KVSizing(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        block_bytes=block_bytes,
        kv_bytes_per_token=kv_per_token,
        weight_bytes=weights,
        activation_bytes=activation,
    )
