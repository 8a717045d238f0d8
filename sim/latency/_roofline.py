"""Roofline iteration-latency model (DESIGN section 5).

A step is a sequence of kernels, and each kernel is bounded by its own roofline: compute time is its FLOPs at a
fraction (``mfu``) of the GPU's dense peak, memory time is the bytes it moves at a fraction (``bw_eff``) of HBM
bandwidth, and the kernel takes the larger of the two (softened near the ridge point, see ``roofline_norm``).
The step's time is the sum over its parts, plus a per-step and per-sequence host overhead:

- **linear layers** (QKV, O, MLP, MoE experts) run once over all tokens of the step, prefill chunks and decodes
  together, so the weights are streamed once per step, not once per part;
- **LM head**: vLLM computes logits only for the positions it samples (one per scheduled sequence), so its
  FLOPs scale with sequences, not tokens; the embedding lookup reads a few rows and is ignored;
- **prefill attention** (compute-bound: causal pairs of the chunks) and **decode attention** (memory-bound: KV
  read) are separate kernels, so the KV read of the decodes is not hidden under the prefill's FLOPs.  A plain
  ``max(total FLOPs, total bytes)`` over the whole batch would hide it and under-predict mixed steps;
- **tensor parallelism** divides weights, FLOPs and KV per GPU and adds two all-reduces of the hidden state per
  layer (after attention and after the MLP);
- **host link** (swap, CPU offload): ``blocks * block_bytes / link_bw + per_copy_overhead * copies``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from sim.latency._base import LatencyModel, StepShape
from sim.profiles import GpuProfile, ModelProfile


@dataclass(frozen=True)
class LatencyCoefficients:
    """The fitted part of the model; ``kvtune calibrate`` refits these to replay measurements.

    Each default is set from a measurement (run ``benchmarks/latency_validation.py`` for the errors they give):

    - ``mfu`` 0.68: bf16 GEMM throughput at >= 512 tokens is 68-76% of dense peak in Vidur's operator profiles
      (shared/data/vidur-profiles: Llama-2-7B QKV+O+MLP at 4096 tokens, 223 TFLOP/s on A100, 749 on H100);
      end-to-end prefill reaches 61-67% on A100 in the TensorRT-LLM first-token table (validation_points.yaml),
      the rest being norms, rotary and activation kernels that this model does not list separately.  Also used
      for attention (FlashAttention, bf16 even with fp8 KV).
    - ``mfu_fp8`` 0.45: fp8 GEMMs reach a smaller share of the (twice as high) fp8 peak: NIM Llama-3.3-70B fp8
      TP2 on H100 prefills 5000 tokens in 407 ms (~0.49 of fp8 peak including all-reduce), TensorRT-LLM v0.5
      first-token latency on H100/L40S implies 0.35-0.52.  Used only where the GPU has fp8 tensor cores
      (``quantization: fp8``); on A100 fp8 weights are dequantized to bf16 (Marlin W8A16) and run at ``mfu``.
    - ``bw_eff`` 0.78: one-token GEMMs (pure weight streaming) in Vidur's profiles move 75-78% of peak HBM
      bandwidth on A100 and 77-86% on H100 (Llama-2-7B, Llama-3-8B, Llama-2-70B layers).
    - ``roofline_norm`` 2: a kernel's time is ``(compute**p + memory**p) ** (1/p)``; ``inf`` is the hard
      roofline ``max``.  Near the ridge (64-512 tokens) loads and math do not overlap perfectly: Vidur's
      GEMM times there are 20-40% above the hard max (H100 Llama-2-7B at 256 tokens: 0.26 ms measured per
      layer, 0.16 ms hard max, 0.21 ms with p=2); p=2 halves the error over 1-4096 tokens.
    - ``overhead_s`` 2 ms: per-step host time (scheduling, input preparation, sampling); TensorRT-LLM first-token
      latency at 128 tokens is 2-3 ms above the GEMM roofline on A100/H100 (validation_points.yaml), and vLLM's
      2024-09 performance blog puts scheduling at ~29% of a small model's step before async scheduling.
    - ``per_seq_overhead_s`` 15 us per scheduled sequence (block tables, sampling metadata, detokenisation);
      NIM Llama-3.3-70B ITL grows 18.6 -> 21.8 ms from 1 to 5 concurrent requests, of which the model's
      KV read and amortised prefill explain all but ~0.1 ms per added sequence, so this stays small.
    - ``per_copy_overhead_s`` 8 us per host-link copy call (``cudaMemcpyAsync``, one per block per layer for
      K and V in vLLM V0): vLLM V0 ``swap_blocks`` reached only 3.1 GB/s moving 1250 blocks on A100-40GB
      (vLLM PR #11531, 32 KiB copies: ~10 us per copy of which ~1.5 us is transfer); the vLLM paper's
      figure 19 reading (block size 1: ~135 ms swap in+out vs ~15 ms at block 256) implies 3-5 us.
    - ``link_eff`` 1.0: ``host_link_gbps`` in hardware.yaml is already a measured pinned-memory rate.
    - ``allreduce_latency_s`` 8 us per all-reduce: vLLM's custom all-reduce takes 8.5-11.8 us for messages up
      to 32 KiB on H100 at TP 2-8 without CUDA graphs (sgl-project/sglang PR #2904), less inside graphs.
    - ``allreduce_bw_eff`` 0.65: NCCL all-reduce bus bandwidth is 171-191 GB/s of 300 on DGX A100 and 293-374
      of 450 on DGX H100 (Vidur network profiles, 4-64 MB messages).
    """

    overhead_s: float = 0.002
    per_seq_overhead_s: float = 15e-6
    mfu: float = 0.68
    mfu_fp8: float = 0.45
    bw_eff: float = 0.78
    roofline_norm: float = 2.0
    link_eff: float = 1.0
    per_copy_overhead_s: float = 8e-6
    allreduce_latency_s: float = 8e-6
    allreduce_bw_eff: float = 0.65

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Bytes per activation element exchanged by the TP all-reduce (bf16 hidden states, also with fp8 weights).
_ACT_BYTES = 2
#: The LM head stays bf16 under fp8 quantization (vLLM quantizes linear layers only; ParallelLMHead is not).
_LM_HEAD_BYTES = 2


class RooflineModel(LatencyModel):
    """Roofline step time for one model on one GPU type at a tensor-parallel degree.

    ``kv_dtype_bytes`` is 1 for an fp8 KV cache (half the KV bytes read; attention still computes in bf16);
    ``weight_dtype_bytes`` is 1 for fp8 weights (half the weight bytes; fp8 tensor cores where the GPU has them).
    Parameter counts assume untied input and output embeddings, as in every bundled model profile.
    """

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
        self.tensor_parallel = tp = int(tensor_parallel)
        self.kv_dtype_bytes = kv_dtype_bytes
        self.weight_dtype_bytes = weight_dtype_bytes
        self.block_size = block_size
        self.coefficients = c = coefficients or LatencyCoefficients()
        if tp < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
        p = float(c.roofline_norm)
        self._p = None if math.isinf(p) else p

        bf16_rate = gpu.bf16_tflops * 1e12 * c.mfu
        fp8_gemm = weight_dtype_bytes == 1 and bool(gpu.fp8_tflops)
        #: Linear layers: fp8 tensor cores for fp8 weights where the GPU has them, else bf16 (A100 dequantizes).
        self._linear_flops_per_s = gpu.fp8_tflops * 1e12 * c.mfu_fp8 if fp8_gemm else bf16_rate
        #: Attention and the (unquantized) LM head always compute in bf16.
        self._bf16_flops_per_s = bf16_rate
        self._bytes_per_s = gpu.hbm_bw_gbps * 1e9 * c.bw_eff
        self._link_bytes_per_s = gpu.host_link_gbps * 1e9 * c.link_eff

        # ---- parameters, per GPU ---------------------------------------------------------------------
        vocab_params = model.vocab_size * model.hidden_size
        body_params = model.params - 2 * vocab_params  # transformer layers: all but embedding and LM head
        body_active = model.active_params - 2 * vocab_params
        self._body_flops_per_token = 2.0 * body_active / tp
        self._body_bytes = body_params * weight_dtype_bytes / tp
        self._lm_flops_per_seq = 2.0 * vocab_params / tp
        self._lm_bytes = vocab_params * (_LM_HEAD_BYTES if weight_dtype_bytes == 1 else weight_dtype_bytes) / tp
        # MoE: a step reads only the experts some token routes to.  With k of E experts per token, chosen
        # independently, an expert is untouched by T tokens with probability (1 - k/E)**T.
        self._moe_untouched = 0.0
        self._moe_expert_bytes = 0.0
        if model.is_moe:
            per_expert = (model.params - model.active_params) / (model.num_experts - model.experts_per_token)
            self._moe_untouched = 1.0 - model.experts_per_token / model.num_experts
            self._moe_expert_bytes = per_expert * model.num_experts * weight_dtype_bytes / tp

        # ---- attention ---------------------------------------------------------------------------------
        q_width = model.num_attention_heads * model.head_dim / tp
        # QK^T and PV: 2 matmuls * 2 FLOPs per multiply-add over the query width, per layer, per
        # (query token, context token) pair.  GQA does not reduce FLOPs, only KV bytes.
        self._attn_flops_per_pair = 4.0 * model.num_layers * q_width
        self._kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype_bytes, tp)
        self._block_bytes = block_size * self._kv_bytes_per_token

        # ---- tensor-parallel all-reduce ------------------------------------------------------------------
        # Two all-reduces of the hidden state per layer; a ring moves 2 (tp-1)/tp of the message over each
        # GPU's link (NVLink per direction, or PCIe for L40S).
        self._allreduce_s_per_token = 0.0
        self._allreduce_fixed_s = 0.0
        if tp > 1:
            link = gpu.gpu_link_gbps * 1e9 * c.allreduce_bw_eff
            per_token_bytes = model.hidden_size * _ACT_BYTES * 2.0 * (tp - 1) / tp
            self._allreduce_s_per_token = 2 * model.num_layers * per_token_bytes / link
            self._allreduce_fixed_s = 2 * model.num_layers * c.allreduce_latency_s

    # ------------------------------------------------------------------------------------------------
    def _roof(self, flops_time, bytes_time):
        """Kernel time from its compute and memory times: ``max`` when ``roofline_norm`` is inf, else the
        p-norm (works on floats and arrays alike)."""
        p = self._p
        if p is None:
            return np.maximum(flops_time, bytes_time)
        if p == 2.0:
            return (flops_time * flops_time + bytes_time * bytes_time) ** 0.5
        return (flops_time**p + bytes_time**p) ** (1.0 / p)

    def _body_weight_bytes(self, num_tokens):
        """Transformer-layer weight bytes streamed for a step of ``num_tokens`` tokens (MoE: touched experts)."""
        if not self._moe_expert_bytes:
            return self._body_bytes
        return self._body_bytes - self._moe_expert_bytes * self._moe_untouched ** num_tokens

    def linear_time(self, num_tokens):
        """Time of the transformer layers' GEMMs (QKV, O, MLP or experts) over ``num_tokens`` tokens, all layers,
        without the LM head, attention or overheads: the quantity Vidur's ``mlp.csv`` profiles per layer."""
        return self._roof(
            self._body_flops_per_token * num_tokens / self._linear_flops_per_s,
            self._body_weight_bytes(num_tokens) / self._bytes_per_s,
        )

    def _time(self, tokens, num_seqs, prefill_attention, prefill_context, decode_context):
        """Step time without swap; every argument may be a float or an array (same formula for both paths)."""
        c = self.coefficients
        bw = self._bytes_per_s
        bf16 = self._bf16_flops_per_s
        t = c.overhead_s + c.per_seq_overhead_s * num_seqs + self.linear_time(tokens)
        t = t + self._roof(self._lm_flops_per_seq * num_seqs / bf16, self._lm_bytes / bw)
        t = t + self._roof(
            self._attn_flops_per_pair * decode_context / bf16, self._kv_bytes_per_token * decode_context / bw
        )
        if self.tensor_parallel > 1:
            t = t + self._allreduce_fixed_s + self._allreduce_s_per_token * tokens
        if prefill_attention or prefill_context:
            t = t + self._roof(
                self._attn_flops_per_pair * prefill_attention / bf16, self._kv_bytes_per_token * prefill_context / bw
            )
        return t

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.num_decode
        if tokens == 0:
            return self.swap_time(shape.swap_blocks, shape.swap_copies) if shape.swap_blocks else 0.0
        # Logits are computed once per scheduled sequence; a shape built by hand may leave num_seqs at 0.
        num_seqs = shape.num_seqs or (shape.num_decode + (1 if shape.prefill_tokens else 0))
        t = float(
            self._time(
                float(tokens),
                float(num_seqs),
                float(shape.prefill_attention),
                float(shape.prefill_context),
                float(shape.decode_context),
            )
        )
        if shape.swap_blocks:
            t += self.swap_time(shape.swap_blocks, shape.swap_copies)
        return t

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        if batch_size <= 0:
            return np.zeros(num_steps)
        ctx = float(context_sum) + float(batch_size) * np.arange(num_steps, dtype=np.float64)
        b = float(batch_size)
        return np.asarray(self._time(b, b, 0.0, 0.0, ctx), dtype=np.float64)

    def swap_time(self, num_blocks: int, num_copies: int) -> float:
        """Host-link time: bytes over the measured pinned-memory rate plus a fixed cost per copy call.  Under
        TP each GPU moves its own share of every block over its own link, in parallel."""
        return num_blocks * self._block_bytes / self._link_bytes_per_s + self.coefficients.per_copy_overhead_s * num_copies
