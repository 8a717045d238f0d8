"""Shared builders for the latency-model tests (imported as ``tests.sim.latency._helpers``)."""

from __future__ import annotations

from sim.latency import LatencyCoefficients, RooflineModel, StepShape
from sim.profiles import load_gpu, load_model

REQUIRED_GPUS = ("A100-80GB", "H100-SXM", "H200", "L40S")
REQUIRED_MODELS = ("Llama-3-8B", "Llama-3-70B", "Qwen2.5-7B", "Mixtral-8x7B")


def roofline(model: str = "Llama-3-8B", gpu: str = "H100-SXM", tp: int = 1, kv_fp8: bool = False,
             fp8: bool = False, block_size: int = 16, **coefficients) -> RooflineModel:
    coef = LatencyCoefficients(**coefficients) if coefficients else None
    return RooflineModel(load_model(model), load_gpu(gpu), tensor_parallel=tp, kv_dtype_bytes=1 if kv_fp8 else 2,
                         weight_dtype_bytes=1 if fp8 else 2, block_size=block_size, coefficients=coef)


def prefill(tokens: int, context_before: int = 0) -> StepShape:
    """One prefill chunk of ``tokens`` after ``context_before`` cached tokens (as the schedulers build it)."""
    return StepShape(prefill_tokens=tokens, prefill_attention=tokens * (context_before + tokens / 2),
                     prefill_context=context_before + tokens, num_seqs=1)


def decode(batch: int, context_per_seq: int) -> StepShape:
    return StepShape(num_decode=batch, decode_context=batch * context_per_seq, num_seqs=batch)
