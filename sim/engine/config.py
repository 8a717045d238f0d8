"""Engine configuration: the knobs kvtune searches, typed, with bounds and cross-field checks.

Mirrors vLLM's own config classes (vllm/config.py, SchedulerConfig/CacheConfig, 0.8.5.post1 for V0 and
0.33.0 for V1): one field per ``vllm serve`` flag, plus kvtune's own admission policies.  ``None`` means
"the flavor's default", resolved by :meth:`EngineConfig.resolve`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from sim.errors import ConfigError
from sim.fields import check_keys, fail, float_in, int_in, kind_words, one_of, to_bool

Flavor = Literal["vllm-v1", "vllm-v0"]
FLAVORS = ("vllm-v1", "vllm-v0")

#: Knobs that exist in only one flavor: setting them on the other is an error naming the key.
V1_ONLY = frozenset({"watermark", "scheduler_reserve_full_isl", "long_prefill_token_threshold", "kv_offloading_size_gb",
                     "async_scheduling"})
V0_ONLY = frozenset({"preemption_mode", "swap_space_gb", "enable_chunked_prefill"})


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration.  Each field: meaning, bounds, vLLM flag."""

    flavor: Flavor = "vllm-v1"
    #: ``--max-num-seqs``: most sequences running at once. [1, 4096]. Default by release and device
    #: (sim/engine/defaults.py: 0.33 gives 1024 on H100/H200, 256 on A100/L40S, 128 per CPU worker; V0 256).
    max_num_seqs: int | None = None
    #: ``--max-num-batched-tokens``: token budget per step. [16, 1_048_576]. Default by release and device
    #: (0.33: 8192 on H100/H200, 2048 on A100/L40S, 16384 at >= 160 GiB); V0 2048 with chunked prefill, else
    #: max(max_model_len, 2048).
    max_num_batched_tokens: int | None = None
    #: ``--gpu-memory-utilization``: share of GPU memory vLLM may use. (0, 1]. Default 0.92 from 0.25, 0.9 before.
    gpu_memory_utilization: float | None = None
    #: ``--block-size``: tokens per KV block. One of 8, 16, 32, 64, 128.
    block_size: int = 16
    #: ``--kv-cache-dtype``: ``auto`` (the model dtype, bf16) or ``fp8`` (half the bytes per token).
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    #: ``--quantization``: ``none`` (bf16 weights) or ``fp8`` (fp8 weights and fp8 tensor cores).
    quantization: Literal["none", "fp8"] = "none"
    #: ``--tensor-parallel-size``: 1, 2, 4 or 8.
    tensor_parallel_size: int = 1
    #: ``--max-model-len``: longest sequence; default the model's own. [16, model max].
    max_model_len: int | None = None
    #: ``--scheduling-policy``: fcfs or priority (V1; kvtune's V0 supports fcfs only).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    #: ``--enable-prefix-caching``: default on for V1, off for V0 (V0 prefix caching is not simulated).
    enable_prefix_caching: bool | None = None
    # ---- V1 only --------------------------------------------------------------------------------------
    #: ``--watermark``: share of blocks kept free when admitting while something runs. [0, 0.5]. Default 0.
    watermark: float | None = None
    #: ``scheduler_reserve_full_isl``: admit only if the whole input fits. Default on.
    scheduler_reserve_full_isl: bool | None = None
    #: ``--long-prefill-token-threshold``: cap on one request's tokens per step; 0 = off. [0, 1_048_576].
    long_prefill_token_threshold: int | None = None
    #: ``--kv-offloading-size`` (GiB, ``--kv-offloading-backend native``): CPU KV tier; 0 = off. [0, 4096].
    kv_offloading_size_gb: float | None = None
    #: ``--async-scheduling``: schedule step N+1 while step N runs on the GPU (vLLM config/vllm.py; on by
    #: default in 0.17.1 and every later listed release for a plain decoder LLM; off in 0.11.0 and older).
    async_scheduling: bool | None = None
    # ---- V0 only --------------------------------------------------------------------------------------
    #: ``--preemption-mode``: recompute or swap. Default recompute (single-sequence requests).
    preemption_mode: Literal["recompute", "swap"] | None = None
    #: ``--swap-space`` (GiB of CPU swap for swap preemption). [0, 4096]. Default 4.
    swap_space_gb: float | None = None
    #: ``--enable-chunked-prefill`` (V0). Default off.
    enable_chunked_prefill: bool | None = None
    # ---- kvtune's own policies (no vLLM flag; exported as recommendations) ----------------------------
    #: Share of GPU blocks only already-running sequences may grow into. [0, 0.9].
    reserved_kv_fraction: float = 0.0
    #: ``greedy`` (vLLM's admission) or ``predicted`` (admit only if prompt + predicted output fits).
    admission_policy: Literal["greedy", "predicted"] = "greedy"
    #: Quantile of the class's output length used by predicted admission. [0.5, 1.0).
    admission_quantile: float = 0.9
    #: Share of GPU blocks that must stay free after a predicted admission. [0, 0.5].
    admission_headroom: float = 0.0
    # ---- simulation-only ------------------------------------------------------------------------------
    #: Fix the number of GPU blocks instead of deriving it from memory (vLLM's ``num_gpu_blocks_override``).
    num_gpu_blocks_override: int | None = None
    #: The vLLM release whose defaults fill the unset knobs (sim/data/vllm_defaults.yaml); ``None``: the
    #: flavor's reference release (0.33.0 for V1, 0.8.5 for V0).  Studies set it from ``vllm_version``.
    engine_version: str | None = None

    def __post_init__(self) -> None:
        self._check()

    # ------------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, knobs: dict[str, Any], where: str = "engine") -> "EngineConfig":
        """Build from a mapping of knob name -> value; unknown names are errors that suggest the closest."""
        check_keys(knobs, _FIELD_TYPES, where, what="engine knob")
        coerced = {key: _coerce(key, value, where) for key, value in knobs.items()}
        return cls(**coerced)

    def replace(self, **changes: Any) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def explicit_knobs(self) -> dict[str, Any]:
        """Fields that differ from the dataclass defaults (what the user set)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = value
        return out

    @property
    def is_v1(self) -> bool:
        return self.flavor == "vllm-v1"

    def resolve(self, model_max_len: int, device: Any = None, *, check: bool = True) -> "EngineConfig":
        """Fill every ``None`` with the default of the config's vLLM release on ``device`` (a GpuProfile; ``None``
        means unknown, which vLLM treats as a small device) for a model whose max length is ``model_max_len``;
        then, with ``check``, apply the start-up rules across fields (:meth:`check_resolved`).  ``check=False``:
        the defaults a config would run with, for code that repairs a config those rules refuse."""
        from sim.engine.defaults import engine_defaults

        max_model_len = self.max_model_len or model_max_len
        if max_model_len > model_max_len:
            raise ConfigError("max_model_len", f"{max_model_len} exceeds the model's maximum {model_max_len}")
        base = engine_defaults(self.flavor, self.engine_version, device, self.tensor_parallel_size, max_model_len,
                               self.enable_chunked_prefill)
        common = dict(
            max_model_len=max_model_len,
            max_num_seqs=self.max_num_seqs or base.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or base.max_num_batched_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization or base.gpu_memory_utilization,
            engine_version=base.version,
        )
        if self.is_v1:
            resolved = dataclasses.replace(
                self,
                **common,
                enable_prefix_caching=True if self.enable_prefix_caching is None else self.enable_prefix_caching,
                watermark=0.0 if self.watermark is None else self.watermark,
                scheduler_reserve_full_isl=True if self.scheduler_reserve_full_isl is None else self.scheduler_reserve_full_isl,
                long_prefill_token_threshold=self.long_prefill_token_threshold or 0,
                kv_offloading_size_gb=self.kv_offloading_size_gb or 0.0,
                async_scheduling=base.async_scheduling if self.async_scheduling is None else self.async_scheduling,
            )
        else:
            resolved = dataclasses.replace(
                self,
                **common,
                enable_prefix_caching=False,
                enable_chunked_prefill=base.enable_chunked_prefill,
                preemption_mode=self.preemption_mode or "recompute",
                swap_space_gb=4.0 if self.swap_space_gb is None else self.swap_space_gb,
            )
        if check:
            resolved.check_resolved()
        return resolved

    def check_resolved(self) -> None:
        """The rules vLLM's start-up applies across the fields of a resolved config (ConfigError naming the field)."""
        max_model_len = self.max_model_len
        # vLLM 0.8.5 config.py (SchedulerConfig._verify_args): V0 without chunked prefill needs a budget that
        # holds a whole max-length prompt.
        if not self.is_v1 and not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ConfigError(
                "max_num_batched_tokens",
                f"{self.max_num_batched_tokens} is smaller than max_model_len {max_model_len}; "
                "V0 without chunked prefill needs it at least as large (enable_chunked_prefill=true or raise it)",
            )
        # Both engines refuse to start with fewer batched tokens than sequences (V0 config.py
        # SchedulerConfig._verify_args; V1 config/scheduler.py validator), and V1 a prefill cap above the
        # longest sequence.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max_num_batched_tokens",
                f"{self.max_num_batched_tokens} is smaller than max_num_seqs {self.max_num_seqs} (vLLM refuses this)",
            )
        if self.is_v1 and self.long_prefill_token_threshold > max_model_len:
            raise ConfigError(
                "long_prefill_token_threshold",
                f"{self.long_prefill_token_threshold} exceeds max_model_len {max_model_len} (vLLM refuses this)",
            )

    # ------------------------------------------------------------------------------------------------
    def _check(self) -> None:
        one_of("flavor", self.flavor, FLAVORS)
        if self.max_num_seqs is not None:
            int_in("max_num_seqs", self.max_num_seqs, 1, 4096)
        if self.max_num_batched_tokens is not None:
            int_in("max_num_batched_tokens", self.max_num_batched_tokens, 16, 1_048_576)
        if self.gpu_memory_utilization is not None:
            float_in("gpu_memory_utilization", self.gpu_memory_utilization, 0.05, 1.0)
        one_of("block_size", self.block_size, (8, 16, 32, 64, 128))
        one_of("kv_cache_dtype", self.kv_cache_dtype, ("auto", "fp8"))
        one_of("quantization", self.quantization, ("none", "fp8"))
        one_of("tensor_parallel_size", self.tensor_parallel_size, (1, 2, 4, 8))
        if self.max_model_len is not None:
            int_in("max_model_len", self.max_model_len, 16, 10_000_000)
        one_of("scheduling_policy", self.scheduling_policy, ("fcfs", "priority"))
        if self.watermark is not None:
            float_in("watermark", self.watermark, 0.0, 0.5)
        if self.long_prefill_token_threshold is not None:
            int_in("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, 1_048_576)
        if self.kv_offloading_size_gb is not None:
            float_in("kv_offloading_size_gb", self.kv_offloading_size_gb, 0.0, 4096.0)
        if self.preemption_mode is not None:
            one_of("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        if self.swap_space_gb is not None:
            float_in("swap_space_gb", self.swap_space_gb, 0.0, 4096.0)
        float_in("reserved_kv_fraction", self.reserved_kv_fraction, 0.0, 0.9)
        one_of("admission_policy", self.admission_policy, ("greedy", "predicted"))
        float_in("admission_quantile", self.admission_quantile, 0.5, 0.999)
        float_in("admission_headroom", self.admission_headroom, 0.0, 0.5)
        if self.num_gpu_blocks_override is not None:
            int_in("num_gpu_blocks_override", self.num_gpu_blocks_override, 2, 100_000_000)
        for name in _BOOL_KNOBS:  # true or false: a YAML 2 or "no" is not silently truthy
            value = getattr(self, name)
            if value is not None and value is not True and value is not False:
                to_bool(name, value)
        if self.engine_version is not None:
            from sim.engine.defaults import release_defaults

            release_defaults(self.engine_version, self.flavor)  # a readable, listed release (else ConfigError)
        # Cross-field: knobs the flavor does not have.
        other_only = V0_ONLY if self.is_v1 else V1_ONLY
        for name in sorted(other_only):
            if getattr(self, name) is not None:
                raise ConfigError(name, f"is not a knob of {self.flavor} (it exists only in the other flavor)")
        if not self.is_v1 and self.scheduling_policy != "fcfs":
            raise ConfigError("scheduling_policy", "kvtune's vllm-v0 flavor simulates fcfs only")
        if not self.is_v1 and self.enable_prefix_caching:
            raise ConfigError("enable_prefix_caching", "prefix caching is simulated for vllm-v1 only")


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
_BOOL_KNOBS = tuple(name for name, kind in _FIELD_TYPES.items() if kind.startswith("bool"))


def _coerce(key: str, value: Any, where: str) -> Any:
    """Turn ``--set key=value`` strings (and YAML scalars) into the field's type."""
    kind = _FIELD_TYPES[key]
    if not isinstance(value, str):
        if "float" in kind and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    text = value.strip()
    if text.lower() in ("none", "null", "default"):
        return None
    try:
        if kind.startswith("bool"):
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise fail(f"{where}.{key}", kind_words(kind), value) from None
    return text
