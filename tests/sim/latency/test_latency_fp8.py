"""fp8: an fp8 KV cache halves KV bytes; fp8 weights halve weight bytes and use fp8 tensor cores where present."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import REQUIRED_MODELS, decode, prefill, roofline


@pytest.mark.parametrize("model", REQUIRED_MODELS)
def test_fp8_kv_halves_block_bytes(model):
    bf16 = roofline(model, "H100-SXM", tp=8 if model == "Llama-3-70B" else 1)
    fp8 = roofline(model, "H100-SXM", tp=8 if model == "Llama-3-70B" else 1, kv_fp8=True)
    # No per-copy cost: swap time is block bytes over the link.
    assert fp8.swap_time(100, 0) == pytest.approx(bf16.swap_time(100, 0) / 2, rel=1e-12)


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM", "L40S"])
def test_fp8_kv_halves_decode_kv_read_time(gpu):
    """The context-dependent part of a decode step (the KV read) halves; attention FLOPs do not change, which
    the memory-bound GQA decode barely notices."""
    def kv_part(lm):
        return lm.step_time(decode(64, 20000)) - lm.step_time(decode(64, 10000))

    ratio = kv_part(roofline("Llama-3-8B", gpu, kv_fp8=True)) / kv_part(roofline("Llama-3-8B", gpu))
    assert ratio == pytest.approx(0.5, abs=0.02)


def test_fp8_weights_speed_up_weight_bound_decode():
    bf16 = roofline("Llama-3-8B", "H100-SXM").step_time(decode(1, 100))
    fp8 = roofline("Llama-3-8B", "H100-SXM", fp8=True).step_time(decode(1, 100))
    assert 0.45 < fp8 / bf16 < 0.75  # weights halve; fixed costs and the bf16 LM head do not


def test_fp8_tensor_cores_only_where_the_gpu_has_them():
    """Compute-bound prefill: faster with fp8 weights on H100 (fp8 tensor cores), not on A100 (W8A16)."""
    h100 = [roofline("Llama-3-8B", "H100-SXM", fp8=f).step_time(prefill(8192)) for f in (False, True)]
    a100 = [roofline("Llama-3-8B", "A100-80GB", fp8=f).step_time(prefill(8192)) for f in (False, True)]
    assert h100[1] < 0.85 * h100[0]
    assert a100[1] == pytest.approx(a100[0], rel=0.02)


def test_attention_stays_bf16_with_fp8_weights():
    """Long-context prefill attention costs the same with fp8 weights (FlashAttention computes in bf16)."""
    def attention_part(lm):
        long = lm.step_time(prefill(1024, context_before=30000))
        short = lm.step_time(prefill(1024, context_before=0))
        return long - short

    assert attention_part(roofline("Llama-3-8B", "H100-SXM", fp8=True)) == pytest.approx(
        attention_part(roofline("Llama-3-8B", "H100-SXM")), rel=0.02)
