"""MoE: weight reads follow the experts the step's tokens touch; FLOPs follow the active parameters."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import decode, prefill, roofline


def _body_bytes(model, touched_share):
    vocab = model.vocab_size * model.hidden_size
    per_expert = (model.params - model.active_params) / (model.num_experts - model.experts_per_token)
    experts = per_expert * model.num_experts
    return (model.params - 2 * vocab - experts * (1 - touched_share)) * 2


def test_one_token_reads_only_its_experts():
    lm = roofline("Mixtral-8x7B", "H100-SXM", roofline_norm=float("inf"))
    m = lm.model
    expected = _body_bytes(m, m.experts_per_token / m.num_experts) / (lm.gpu.hbm_bw_gbps * 1e9 * lm.coefficients.bw_eff)
    assert lm.linear_time(1) == pytest.approx(expected, rel=1e-9)


def test_many_tokens_read_every_expert():
    lm = roofline("Mixtral-8x7B", "H100-SXM", roofline_norm=float("inf"))
    all_bytes = _body_bytes(lm.model, 1.0) / (lm.gpu.hbm_bw_gbps * 1e9 * lm.coefficients.bw_eff)
    assert lm.linear_time(64) >= all_bytes * 0.99


def test_moe_decode_cost_rises_with_batch_towards_dense_reads():
    lm = roofline("Mixtral-8x7B", "H100-SXM", tp=2)
    t = [lm.step_time(decode(b, 512)) for b in (1, 2, 4, 8, 32)]
    assert all(a < b for a, b in zip(t, t[1:]))
    assert t[3] / t[0] > 1.5  # 1 token touches 2 of 8 experts, 8 tokens nearly all


def test_moe_prefill_flops_follow_active_params():
    """A compute-bound Mixtral prefill costs about as much as a dense model with its active parameters
    (12.9B), not its total (46.7B): well under 2x Llama-3-8B."""
    mixtral = roofline("Mixtral-8x7B", "H100-SXM", tp=2).step_time(prefill(8192))
    llama8 = roofline("Llama-3-8B", "H100-SXM", tp=2).step_time(prefill(8192))
    assert 1.2 < mixtral / llama8 < 2.2
