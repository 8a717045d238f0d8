"""Tensor parallelism: less per-GPU work, plus all-reduces."""

from __future__ import annotations

import math

import pytest
from tests.sim.latency._helpers import REQUIRED_GPUS, decode, prefill, roofline


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM", "H200"])  # NVLink parts
@pytest.mark.parametrize(("model", "tokens"), [("Llama-3-70B", 8192), ("Llama-3-8B", 4096), ("Mixtral-8x7B", 4096)])
def test_tp_reduces_big_prefill_time(model, gpu, tokens):
    times = [roofline(model, gpu, tp=tp).step_time(prefill(tokens)) for tp in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(times, times[1:])), times


def test_tp_speedup_is_sublinear():
    """All-reduces and fixed costs keep TP8 from being 8x faster."""
    t1 = roofline("Llama-3-70B", "H100-SXM", tp=1).step_time(prefill(8192))
    t8 = roofline("Llama-3-70B", "H100-SXM", tp=8).step_time(prefill(8192))
    assert 4 < t1 / t8 < 8


def test_allreduce_over_pcie_is_costly():
    """L40S has no NVLink: the all-reduce of a big prefill goes over PCIe and eats most of the TP gain."""
    nvlink = roofline("Llama-3-8B", "H100-SXM", tp=4).step_time(prefill(8192))
    nvlink_1 = roofline("Llama-3-8B", "H100-SXM", tp=1).step_time(prefill(8192))
    pcie = roofline("Llama-3-8B", "L40S", tp=4).step_time(prefill(8192))
    pcie_1 = roofline("Llama-3-8B", "L40S", tp=1).step_time(prefill(8192))
    assert pcie_1 / pcie < nvlink_1 / nvlink


@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama3_70b_gives_finite_times_at_every_tp(gpu, tp):
    lm = roofline("Llama-3-70B", gpu, tp=tp)
    for shape in (prefill(4096), decode(1, 100), decode(256, 4000)):
        t = lm.step_time(shape)
        assert math.isfinite(t) and t > 0
    run = lm.decode_run_times(64, 64 * 1000, 10)
    assert all(math.isfinite(x) and x > 0 for x in run)


def test_kv_heads_replicate_beyond_their_count():
    """Llama-3-70B has 8 KV heads: at TP8 each GPU holds one, and TP cannot split it further."""
    lm8 = roofline("Llama-3-70B", "H100-SXM", tp=8)
    lm4 = roofline("Llama-3-70B", "H100-SXM", tp=4)
    assert lm8.swap_time(1, 0) == pytest.approx(lm4.swap_time(1, 0) / 2)
    assert lm8.model.kv_bytes_per_token(2, 16) == lm8.model.kv_bytes_per_token(2, 8)
