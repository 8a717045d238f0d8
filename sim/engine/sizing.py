"""How many KV blocks fit: vLLM's memory profiling, in closed form.

vLLM (0.33 ``v1/worker/gpu_worker.py`` ``determine_available_memory``; 0.8.5 ``worker/worker.py``
``determine_num_available_blocks``) sizes the cache from what one profiling forward pass leaves::

    available_kv = total * gpu_memory_utilization - weights - activation_peak - non_torch - cudagraph_estimate
    num_gpu_blocks = available_kv // block_bytes

- ``total`` is the CUDA total the profiler sees (``GpuProfile.vllm_total_bytes``), not nvidia-smi's figure;
- ``non_torch`` is memory allocated outside PyTorch during the pass: mostly the NCCL / custom all-reduce buffers,
  so it jumps once the model is sharded.  vLLM 0.19.0 logs "non-torch forward increase memory" 0.24-0.27 GiB at
  TP1, 2.06-2.11 GiB at TP2 and 2.13-2.21 GiB at TP4 (llm-d-incubation/llm-d-planner
  accuracy/results/v0.19.0/logs, H100); vLLM PR #10511's V0 profiler logged 1.79 GiB at TP1 and 3.58 GiB at TP2
  (Llama-3-8B, H100, Dec 2024), the releases of the 0.8.5 row;
- ``cudagraph_estimate`` is subtracted from 0.21 on (0.33 ``gpu_worker.py``: "CUDA graph memory profiling is
  enabled (default since v0.21.0)", ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``); before, the graphs were
  captured after sizing and came out of the utilization headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.engine.config import EngineConfig
from sim.engine.defaults import release_tuple
from sim.errors import ConfigError
from sim.profiles import GpuProfile, ModelProfile

GIB = 1024**3

#: Peak activation of V1's profiling pass, per GPU: the dummy sampler run over ``max_num_seqs`` fp32 logit rows
#: (the full vocabulary on every rank, so TP-invariant) dominates; its peak is 3.86x one logits tensor (vLLM
#: 0.19.0 logs "torch peak memory increase" 1.89 GiB for Llama-3.1-8B at TP 1, 2 and 4 with max_num_seqs 1024:
#: 1.89 / (1024 * 128256 * 4 B); Qwen2.5-7B 2.21 GiB, predicted 2.24).  With a small vocabulary the forward
#: pass's MLP intermediate of ``max_num_batched_tokens`` tokens is the peak instead: 1.31x of it (CodeLlama-7b,
#: vocabulary 32016: 0.77 GiB logged).
SAMPLER_PEAK_FACTOR = 3.86
FORWARD_PEAK_FACTOR = 1.31
#: CUDA-graph pool estimate: 0.35 GiB + 17.9 MiB per layer (fit to the "CUDA graph pool memory ... (estimated)"
#: lines of the same vLLM 0.19.0 logs: 0.84 GiB for 32-layer Llama-3.1-8B, 1.82 GiB for 80-layer Llama-3.3-70B
#: at TP2, 0.61-0.69 GiB for 28-layer Qwen2.5-7B).
CUDAGRAPH_BASE_BYTES = 0.35 * GIB
CUDAGRAPH_PER_LAYER_BYTES = 0.0175 * GIB
#: Releases from which the profiler subtracts the CUDA-graph estimate.
CUDAGRAPH_ESTIMATE_FROM = (0, 21, 0)
#: Releases from which the V1 worker's non-torch figures apply (the V0-era profiler of PR #10511 before).
V1_PROFILER_FROM = (0, 10, 0)


@dataclass(frozen=True)
class KVSizing:
    """The KV-cache geometry a config gets on a GPU, with the terms of vLLM's memory profile."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: float
    kv_bytes_per_token: float
    weight_bytes: float
    activation_bytes: float
    non_torch_bytes: float = 0.0
    cudagraph_bytes: float = 0.0
    #: vLLM's "Available KV cache memory" (before rounding down to whole blocks).
    available_kv_bytes: float = 0.0
    #: What ``gpu_memory_utilization`` multiplied.
    device_total_bytes: float = 0.0


def weight_bytes(model: ModelProfile, config: EngineConfig) -> float:
    """Weights per GPU.  fp8 quantizes the linear layers only: the embedding and the LM head stay bf16 (vLLM 0.19
    logs 33.88 GiB for Llama-3.3-70B fp8-dynamic at TP2, = 68.5e9 fp8 body + 2.1e9 bf16 vocab parameters / 2)."""
    tp = config.tensor_parallel_size
    if config.quantization != "fp8":
        return model.params * 2 / tp
    vocab = 2 * model.vocab_size * model.hidden_size
    return ((model.params - vocab) * 1 + vocab * 2) / tp


def activation_peak_bytes(model: ModelProfile, config: EngineConfig) -> float:
    """Peak torch memory of the profiling pass, per GPU (see SAMPLER_PEAK_FACTOR)."""
    tp = config.tensor_parallel_size
    tokens = config.max_num_batched_tokens or 2048
    seqs = config.max_num_seqs or 256
    sampler = SAMPLER_PEAK_FACTOR * seqs * model.vocab_size * 4
    experts = model.experts_per_token if model.is_moe else 1
    forward = FORWARD_PEAK_FACTOR * tokens * (2 * model.intermediate_size * experts / tp + 4 * model.hidden_size) * 2
    return max(sampler, forward)


def non_torch_bytes(config: EngineConfig) -> float:
    """Memory allocated outside PyTorch during profiling (all-reduce buffers once TP > 1); see the module doc."""
    tp = config.tensor_parallel_size
    release = release_tuple(config.engine_version) if config.engine_version else (0, 33, 0)
    if release < V1_PROFILER_FROM:
        return (1.79 if tp == 1 else 3.58) * GIB
    return (0.25 if tp == 1 else 2.07 if tp == 2 else 2.13) * GIB


def cudagraph_bytes(model: ModelProfile, config: EngineConfig) -> float:
    release = release_tuple(config.engine_version) if config.engine_version else (0, 33, 0)
    if not config.is_v1 or release < CUDAGRAPH_ESTIMATE_FROM:
        return 0.0
    return CUDAGRAPH_BASE_BYTES + CUDAGRAPH_PER_LAYER_BYTES * model.num_layers


def size_kv_cache(model: ModelProfile, gpu: GpuProfile, config: EngineConfig) -> KVSizing:
    """Blocks for a resolved config; raises ConfigError when the model does not fit or cannot hold one
    max-length request (vLLM refuses to start then too)."""
    tp = config.tensor_parallel_size
    kv_dtype_bytes = 1 if config.kv_cache_dtype == "fp8" else 2
    kv_per_token = model.kv_bytes_per_token(kv_dtype_bytes, tp)
    block_bytes = config.block_size * kv_per_token
    weights = weight_bytes(model, config)
    activation = activation_peak_bytes(model, config)
    non_torch = non_torch_bytes(config)
    graphs = cudagraph_bytes(model, config)
    total = gpu.vllm_total_bytes
    available = total * config.gpu_memory_utilization - weights - activation - non_torch - graphs
    if config.num_gpu_blocks_override is not None:
        num_gpu_blocks = config.num_gpu_blocks_override
    else:
        if available <= 0:
            raise ConfigError(
                "gpu_memory_utilization",
                f"{model.name} needs {weights / GIB:.1f} GiB of weights per GPU (+{(activation + non_torch + graphs) / GIB:.1f} "
                f"GiB activations, all-reduce buffers and CUDA graphs) but {gpu.name} x{config.gpu_memory_utilization} "
                f"gives {total * config.gpu_memory_utilization / GIB:.1f} GiB; raise tensor_parallel_size or "
                "gpu_memory_utilization",
            )
        num_gpu_blocks = int(available // block_bytes)
    swap_gb = config.swap_space_gb if config.flavor == "vllm-v0" and config.preemption_mode == "swap" else 0.0
    offload_gb = config.kv_offloading_size_gb or 0.0
    num_cpu_blocks = int((swap_gb + offload_gb) * GIB // block_bytes)
    _check_holds_one_request(config, num_gpu_blocks)
    return KVSizing(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        block_bytes=block_bytes,
        kv_bytes_per_token=kv_per_token,
        weight_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cudagraph_bytes=graphs,
        available_kv_bytes=available,
        device_total_bytes=total,
    )


def with_gpu_blocks(sizing: KVSizing, config: EngineConfig) -> KVSizing:
    """``sizing`` (of ``config`` without the override) given ``config.num_gpu_blocks_override`` GPU blocks: what
    ``size_kv_cache`` returns for ``config``, without sizing it again (the override changes nothing else)."""
    blocks = config.num_gpu_blocks_override
    if blocks is None:
        return sizing
    _check_holds_one_request(config, blocks)
    return replace(sizing, num_gpu_blocks=blocks)


def _check_holds_one_request(config: EngineConfig, num_gpu_blocks: int) -> None:
    """ConfigError unless ``num_gpu_blocks`` hold one max-length request (vLLM refuses to start then)."""
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
