"""The profile types: :class:`GpuProfile` (an accelerator) and :class:`ModelProfile` (a transformer).  Both
loaders (:mod:`sim.profiles._profiles` for the bundled YAML and device files, :mod:`sim.profiles._hf` for a Hugging
Face ``config.json``) make them; this module imports neither."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator: memory, bandwidths and dense tensor throughput."""

    name: str
    mem_gb: float
    hbm_bw_gbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    host_link_gbps: float
    gpu_link_gbps: float
    price_per_hour_usd: float
    source: str
    #: Device total as vLLM's memory profiler sees it (torch.cuda.mem_get_info), GiB, where a vLLM log published
    #: it; ``None``: the nvidia-smi total less the H100's published difference (see ``vllm_total_bytes``).
    vllm_total_gib: float | None = None
    #: Where ``price_per_hour_usd`` comes from (provider and page URL) and when it was read or published
    #: (``YYYY-MM`` or ``YYYY-MM-DD``); ``None`` where the device has no price.
    price_source: str | None = None
    price_date: str | None = None
    #: The most of these GPUs one node holds (one server, or one instance of the price list): tensor parallelism
    #: spans at most this many (vLLM runs TP within a node; across nodes is pipeline parallelism, which kvtune does
    #: not model).  8, an HGX/PCIe server's count, unless the device's price list sells it otherwise (GH200: one).
    gpus_per_node: int = 8
    #: The ``kv_cache_dtype`` and ``quantization`` values vLLM can start with on this device; a combination outside
    #: them cannot start and is pruned (optimizer/_capacity.py).  The default, all of kvtune's, holds for every
    #: bundled GPU: vLLM stores an FP8 KV cache on CUDA GPUs from Ampere on (vLLM docs "Quantized KV Cache",
    #: features/quantization/quantized_kvcache.md), and runs FP8 weights with FP8 compute from compute capability
    #: 8.9 (L40S, H100, H200, GH200) and weight-only (FP8 Marlin, W8A16) on Ampere (A100) (vLLM docs "FP8 W8A8",
    #: features/quantization/fp8.md).  A device YAML lists fewer for a device without them.
    kv_cache_dtypes: tuple[str, ...] = ("auto", "fp8")
    quantizations: tuple[str, ...] = ("none", "fp8")
    #: ``"cpu"`` for a CPU engine's device (vLLM's CPU platform rules apply: async scheduling off, the CPU batch
    #: defaults; sim/engine/defaults.py ``is_cpu_device``), ``"gpu"`` for an accelerator; ``None`` (a device YAML
    #: that does not say): a CPU device when its name has the word ``cpu``.
    kind: str | None = None

    def lacks(self, knob: str, value: str) -> bool:
        """Whether vLLM cannot start with ``knob`` (``kv_cache_dtype`` or ``quantization``) at ``value`` here."""
        return value not in (self.kv_cache_dtypes if knob == "kv_cache_dtype" else self.quantizations)

    @property
    def mem_bytes(self) -> float:
        return self.mem_gb * 1e9

    @property
    def has_price(self) -> bool:
        """Whether the device has a price: ``price_per_hour_usd`` 0.0 means unknown (a device YAML without one)."""
        return self.price_per_hour_usd > 0

    @property
    def vllm_total_bytes(self) -> float:
        """What ``gpu_memory_utilization`` multiplies: the CUDA total, smaller than nvidia-smi's by the memory
        the driver reserves (H100 80GB: 79.19-79.22 GiB in vLLM logs vs 79.65 GiB from nvidia-smi, 0.46 GiB)."""
        if self.vllm_total_gib is not None:
            return self.vllm_total_gib * 1024**3
        return self.mem_bytes - 0.46 * 1024**3


@dataclass(frozen=True)
class ModelProfile:
    """One transformer: enough architecture to size weights, KV cache and FLOPs."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params_b: float
    max_model_len: int
    source: str
    active_params_b: float | None = None
    num_experts: int = 1
    experts_per_token: int = 1
    #: Weights' dtype in the checkpoint (``torch_dtype``), informational: sizing follows ``quantization``.
    dtype: str = "bfloat16"
    #: The LM head shares the embedding matrix (its weights are counted, and read, once).
    tie_word_embeddings: bool = False

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def active_params(self) -> float:
        return (self.active_params_b or self.params_b) * 1e9

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> float:
        """Bytes of K and V per token on one GPU: 2 * layers * kv_heads * head_dim * dtype / TP.

        vLLM replicates KV heads when TP exceeds the number of KV heads, so the per-GPU share never
        drops below one head.
        """
        kv_heads_per_gpu = max(1.0, self.num_kv_heads / tensor_parallel)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * dtype_bytes


__all__ = ["GpuProfile", "ModelProfile"]
