"""Host-link cost: bytes over the measured link plus a fixed cost per copy call (vLLM paper fig. 19)."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import REQUIRED_GPUS, roofline

from sim.latency import StepShape


@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
def test_swap_time_per_token_falls_with_block_size(gpu):
    """V0 copies each block once per layer for K and V: small blocks pay the per-copy cost many times."""
    tokens = 4096
    per_token = []
    for block_size in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        lm = roofline("Llama-3-8B", gpu, block_size=block_size)
        blocks = tokens // block_size
        per_token.append(lm.swap_time(blocks, blocks * 2 * lm.model.num_layers) / tokens)
    assert all(a > b for a, b in zip(per_token, per_token[1:])), per_token
    assert per_token[0] > 3 * per_token[-1]


def test_swap_loses_to_recompute_at_small_blocks_only():
    """Figure 19's conclusion on its own setup's scale: Llama-2-7B (MHA, like OPT-13B) on A100, 256 tokens."""
    def swap_and_recompute(block_size):
        lm = roofline("Llama-2-7B", "A100-80GB", block_size=block_size)
        blocks = 256 // block_size
        swap = 2 * lm.swap_time(blocks, blocks * 2 * lm.model.num_layers)
        recompute = lm.step_time(StepShape(prefill_tokens=256, prefill_attention=256 * 128, prefill_context=256,
                                           num_seqs=1))
        return swap, recompute

    swap1, recompute = swap_and_recompute(1)
    swap256, _ = swap_and_recompute(256)
    assert swap1 > recompute > swap256


def test_swap_time_is_linear_in_blocks_and_copies():
    lm = roofline("Llama-3-8B", "A100-80GB")
    c = lm.coefficients
    assert lm.swap_time(0, 0) == 0
    assert lm.swap_time(10, 0) == pytest.approx(10 * lm.swap_time(1, 0))
    assert lm.swap_time(10, 7) - lm.swap_time(10, 0) == pytest.approx(7 * c.per_copy_overhead_s)
    block_bytes = 16 * lm.model.kv_bytes_per_token(2)
    assert lm.swap_time(1, 0) == pytest.approx(block_bytes / (lm.gpu.host_link_gbps * 1e9 * c.link_eff))


def test_swap_only_step_costs_its_transfers():
    """Everything preempted: no forward pass runs, the step is the swap."""
    lm = roofline("Llama-3-8B", "H100-SXM")
    shape = StepShape(swap_blocks=40, swap_copies=40 * 64)
    assert lm.step_time(shape) == pytest.approx(lm.swap_time(40, 40 * 64))
    assert lm.step_time(StepShape()) == 0.0


def test_swap_adds_to_a_decode_step():
    lm = roofline("Llama-3-8B", "H100-SXM")
    plain = StepShape(num_decode=8, decode_context=8000, num_seqs=8)
    swapping = StepShape(num_decode=8, decode_context=8000, num_seqs=8, swap_blocks=10, swap_copies=640)
    assert lm.step_time(swapping) - lm.step_time(plain) == pytest.approx(lm.swap_time(10, 640))
