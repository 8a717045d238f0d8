"""The roofline arithmetic, checked by hand on one configuration (hard max, no fixed costs)."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import prefill, roofline

from sim.latency import StepShape

ZERO_FIXED = dict(overhead_s=0.0, per_layer_overhead_s=0.0, per_seq_overhead_s=0.0, roofline_norm=float("inf"))


def test_prefill_time_by_hand():
    """Llama-3-8B, A100, 2048-token prompt: body GEMMs + LM head for one position + causal attention."""
    lm = roofline("Llama-3-8B", "A100-80GB", **ZERO_FIXED)
    m, c = lm.model, lm.coefficients
    flops_s = 312e12 * c.mfu
    bytes_s = 2039e9 * c.bw_eff
    vocab = m.vocab_size * m.hidden_size
    body = max(2 * (m.params - 2 * vocab) * 2048 / flops_s, (m.params - 2 * vocab) * 2 / bytes_s)
    lm_head = max(2 * vocab / flops_s, vocab * 2 / bytes_s)
    pairs = 2048 * 2048 / 2
    attention = max(4 * m.num_layers * m.num_attention_heads * m.head_dim * pairs / flops_s,
                    m.kv_bytes_per_token(2) * 2048 / bytes_s)
    assert lm.step_time(prefill(2048)) == pytest.approx(body + lm_head + attention, rel=1e-12)


def test_allreduce_by_hand():
    """TP4 adds 2 all-reduces per layer: latency + ring bytes at the achieved NVLink bandwidth."""
    lm1 = roofline("Llama-3-70B", "H100-SXM", tp=4, **ZERO_FIXED)
    lm0 = roofline("Llama-3-70B", "H100-SXM", tp=4, **ZERO_FIXED, allreduce_latency_s=0.0, allreduce_bw_eff=1e12)
    m, c = lm1.model, lm1.coefficients
    tokens = 1000
    shape = StepShape(prefill_tokens=tokens, prefill_attention=tokens * tokens / 2, prefill_context=tokens, num_seqs=1)
    ring = m.hidden_size * 2 * 2 * 3 / 4 * tokens / (450e9 * c.allreduce_bw_eff)
    expected = 2 * m.num_layers * (c.allreduce_latency_s + ring)
    assert lm1.step_time(shape) - lm0.step_time(shape) == pytest.approx(expected, rel=1e-6)


def test_fixed_costs_add_up():
    lm = roofline("Llama-3-8B", "H100-SXM", overhead_s=0.001, per_layer_overhead_s=10e-6, per_seq_overhead_s=5e-6)
    bare = roofline("Llama-3-8B", "H100-SXM", overhead_s=0.0, per_layer_overhead_s=0.0, per_seq_overhead_s=0.0)
    shape = StepShape(num_decode=10, decode_context=10_000, num_seqs=10)
    assert lm.step_time(shape) - bare.step_time(shape) == pytest.approx(0.001 + 32 * 10e-6 + 10 * 5e-6)


def test_smooth_roofline_lies_between_max_and_sum():
    hard = roofline("Llama-2-7B", "H100-SXM", roofline_norm=float("inf"))
    soft = roofline("Llama-2-7B", "H100-SXM", roofline_norm=2.0)
    none = roofline("Llama-2-7B", "H100-SXM", roofline_norm=1.0)
    for tokens in (1, 64, 256, 1024, 4096):
        assert hard.linear_time(tokens) <= soft.linear_time(tokens) <= none.linear_time(tokens)
    # Near the ridge point the difference is largest (Vidur: ~0.26 ms per layer measured at 256 tokens).
    assert soft.linear_time(256) / hard.linear_time(256) > 1.3
