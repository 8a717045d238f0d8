"""Typed GPU and model profiles.

The figures (with their sources) live in ``sim/data/hardware.yaml`` and ``sim/data/models.yaml`` so that an
installed package needs nothing outside itself.  Names are matched exactly, then through each entry's
aliases, case-insensitively.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from sim.errors import ConfigError


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

    @property
    def mem_bytes(self) -> float:
        return self.mem_gb * 1e9

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


def _load_yaml(filename: str) -> dict:
    text = resources.files("sim").joinpath("data", filename).read_text()
    return yaml.safe_load(text)


def _index(filename: str, section: str, cls: type) -> dict:
    """Profiles of one data file, keyed by lower-cased name and every alias."""
    table = {}
    for entry in _load_yaml(filename)[section]:
        entry = dict(entry)
        aliases = entry.pop("aliases", []) or []
        profile = cls(**entry)
        for key in [profile.name, *aliases]:
            table[key.lower()] = profile
    return table


@functools.cache
def _gpus() -> dict[str, GpuProfile]:
    return _index("hardware.yaml", "gpus", GpuProfile)


@functools.cache
def _models() -> dict[str, ModelProfile]:
    return _index("models.yaml", "models", ModelProfile)


def gpu_names() -> list[str]:
    return sorted({p.name for p in _gpus().values()})


def model_names() -> list[str]:
    return sorted({p.name for p in _models().values()})


def load_gpu(name: str, field: str = "gpu") -> GpuProfile:
    try:
        return _gpus()[name.lower()]
    except KeyError:
        raise ConfigError(field, f"unknown GPU {name!r}; known: {', '.join(gpu_names())}") from None


def load_model(name: str, field: str = "model") -> ModelProfile:
    try:
        return _models()[name.lower()]
    except KeyError:
        raise ConfigError(field, f"unknown model {name!r}; known: {', '.join(model_names())}") from None
