"""Roofline iteration-latency model (DESIGN section 5).

A step costs ``overhead + max(compute_time, memory_time)``: compute is FLOPs at a fraction (``mfu``) of the
GPU's dense peak, memory is weights plus KV read at a fraction (``bw_eff``) of HBM bandwidth.  The step is a
single forward pass over prefill chunks and decodes together, so weights are streamed once per step, not once
per part: the roofline is taken over the whole batch.  Tensor parallelism divides weights, FLOPs and KV per
GPU and adds two all-reduces per layer.  Host-link transfers (swap, CPU offload) add
``blocks * block_bytes / link_bw + per_copy_overhead * copies``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from sim.latency._base import LatencyModel, StepShape
from sim.profiles import GpuProfile, ModelProfile


@dataclass(frozen=True)
class LatencyCoefficients:
    """The fitted part of the model; ``kvtune calibrate`` refits these to replay measurements.

    Defaults: mfu 0.6 (end-to-end prefill MFU 61-67% on A100, from TRT-LLM first-token latency in
    shared/data/validation_points.yaml); bw_eff 0.8 (weight-streaming GEMV 76-90% of peak, Vidur profiles);
    step overhead 2 ms and 15 us per sequence (scheduling, sampling, Python; vLLM perf blog 2024-09 puts
    scheduling at ~29% of a small model's step); per-copy overhead 12 us (vLLM V0 swap_blocks reached only
    1.2-3.1 GB/s with 32 KiB copies on A100, vLLM PR#11531).
    """

    overhead_s: float = 0.002
    per_seq_overhead_s: float = 15e-6
    mfu: float = 0.6
    bw_eff: float = 0.8
    link_eff: float = 1.0
    per_copy_overhead_s: float = 12e-6
    allreduce_latency_s: float = 8e-6

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RooflineModel(LatencyModel):
    """Roofline step time for one model on one GPU type at a tensor-parallel degree."""

    def __init__(
        self,
        model: ModelProfile,
        gpu: GpuProfile,
        tensor_parallel: int = 1,
        kv_dtype_bytes: int = 2,
        weight_dtype_bytes: int = 2,
        block_size: int = 16,
        coefficients: LatencyCoefficients | None = None,
    ):
        self.model = model
        self.gpu = gpu
        self.tensor_parallel = tensor_parallel
        self.coefficients = coefficients or LatencyCoefficients()
        c = self.coefficients
        tp = tensor_parallel
        peak_tflops = gpu.fp8_tflops if (weight_dtype_bytes == 1 and gpu.fp8_tflops) else gpu.bf16_tflops
        self._flops_per_s = peak_tflops * 1e12 * c.mfu
        self._bytes_per_s = gpu.hbm_bw_gbps * 1e9 * c.bw_eff
        self._link_bytes_per_s = gpu.host_link_gbps * 1e9 * c.link_eff
        # Per-GPU figures.
        self._linear_flops_per_token = 2.0 * model.active_params / tp
        q_width = model.num_attention_heads * model.head_dim / tp
        # QK^T and PV: 2 matmuls * 2 FLOPs per MAC, per layer, per (query token, context token) pair.
        self._attn_flops_per_pair = 4.0 * model.num_layers * q_width
        self._weight_bytes = model.params * weight_dtype_bytes / tp
        self._kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype_bytes, tp)
        self._block_bytes = block_size * self._kv_bytes_per_token
        # Two all-reduces of the hidden state per layer under TP (ring: 2 (tp-1)/tp of the bytes).
        self._allreduce_bytes_per_token = 0.0
        self._allreduce_fixed_s = 0.0
        if tp > 1:
            link = gpu.gpu_link_gbps * 1e9
            self._allreduce_bytes_per_token = 2 * model.num_layers * model.hidden_size * 2 * 2 * (tp - 1) / tp / link
            self._allreduce_fixed_s = 2 * model.num_layers * c.allreduce_latency_s
        self._moe_fraction = model.experts_per_token / model.num_experts if model.is_moe else 1.0
        self._moe_expert_share = 0.0
        if model.is_moe:
            # Share of parameters that sit in experts: total - active = (E - k) * expert_params.
            expert_params = (model.params - model.active_params) / (model.num_experts - model.experts_per_token)
            self._moe_expert_share = expert_params * model.num_experts / model.params

    # ------------------------------------------------------------------------------------------------
    def _weight_bytes_read(self, num_tokens):
        """Weights streamed in one step; for MoE only the experts some token routes to are read."""
        if not self.model.is_moe:
            return self._weight_bytes
        untouched = (1.0 - self._moe_fraction) ** np.maximum(num_tokens, 1)
        return self._weight_bytes * (1.0 - self._moe_expert_share * untouched)

    def step_time(self, shape: StepShape) -> float:
        c = self.coefficients
        tokens = shape.prefill_tokens + shape.num_decode
        if tokens == 0 and shape.swap_blocks == 0:
            return 0.0
        flops = self._linear_flops_per_token * tokens + self._attn_flops_per_pair * (
            shape.prefill_attention + shape.decode_context
        )
        kv_tokens = shape.prefill_context + shape.decode_context
        mem = float(self._weight_bytes_read(tokens)) + self._kv_bytes_per_token * kv_tokens
        t = c.overhead_s + c.per_seq_overhead_s * shape.num_seqs + max(flops / self._flops_per_s, mem / self._bytes_per_s)
        if self.tensor_parallel > 1:
            t += self._allreduce_fixed_s + self._allreduce_bytes_per_token * tokens
        if shape.swap_blocks:
            t += self.swap_time(shape.swap_blocks, shape.swap_copies)
        return t

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        c = self.coefficients
        ctx = context_sum + batch_size * np.arange(num_steps, dtype=np.float64)
        flops = self._linear_flops_per_token * batch_size + self._attn_flops_per_pair * ctx
        mem = self._weight_bytes_read(batch_size) + self._kv_bytes_per_token * ctx
        t = c.overhead_s + c.per_seq_overhead_s * batch_size + np.maximum(flops / self._flops_per_s, mem / self._bytes_per_s)
        if self.tensor_parallel > 1:
            t = t + self._allreduce_fixed_s + self._allreduce_bytes_per_token * batch_size
        return t

    def swap_time(self, num_blocks: int, num_copies: int) -> float:
        return num_blocks * self._block_bytes / self._link_bytes_per_s + self.coefficients.per_copy_overhead_s * num_copies
