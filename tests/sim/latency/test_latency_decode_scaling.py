"""Decode step time grows with the batch and with the context it reads."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import REQUIRED_GPUS, REQUIRED_MODELS, decode, roofline


@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
@pytest.mark.parametrize("model", REQUIRED_MODELS)
def test_decode_time_grows_with_batch(model, gpu):
    tp = 8 if model == "Llama-3-70B" else 1
    lm = roofline(model, gpu, tp=tp)
    times = [lm.step_time(decode(b, 1024)) for b in (1, 2, 8, 32, 128, 512)]
    assert all(a < b for a, b in zip(times, times[1:])), times


@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
@pytest.mark.parametrize("model", REQUIRED_MODELS)
def test_decode_time_grows_with_context(model, gpu):
    tp = 8 if model == "Llama-3-70B" else 1
    lm = roofline(model, gpu, tp=tp)
    times = [lm.step_time(decode(32, ctx)) for ctx in (16, 256, 2048, 8192, 32768)]
    assert all(a < b for a, b in zip(times, times[1:])), times


def test_small_decode_batch_is_weight_bound():
    """At batch 1 a decode step costs about one read of the weights: Llama-3-8B bf16 on H100 is ~16 GB,
    ~6 ms at 78% of 3.35 TB/s, plus the fixed costs."""
    lm = roofline("Llama-3-8B", "H100-SXM")
    weights_s = lm.model.params * 2 / (lm.gpu.hbm_bw_gbps * 1e9 * lm.coefficients.bw_eff)
    t = lm.step_time(decode(1, 512))
    assert weights_s < t < weights_s + 0.004


def test_long_context_decode_is_kv_bound():
    """At large batch x context the KV read dominates: doubling the context nearly doubles the variable part."""
    lm = roofline("Llama-3-8B", "H100-SXM")
    base = lm.step_time(decode(64, 16))
    t1 = lm.step_time(decode(64, 16000)) - base
    t2 = lm.step_time(decode(64, 32000)) - base
    assert t2 / t1 == pytest.approx(32000 / 16000 * (1 - 16 / 32000) / (1 - 16 / 16000), rel=0.02)
