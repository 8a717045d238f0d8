"""``decode_run_times`` (vectorised, the simulator's hot path) equals a loop of ``step_time``."""

from __future__ import annotations

import numpy as np
from tests.sim.latency._helpers import REQUIRED_GPUS, REQUIRED_MODELS, roofline
from hypothesis import given
from hypothesis import strategies as st

from sim.latency import LatencyModel, LinearStepModel, StepShape


def _loop(lm: LatencyModel, batch: int, context_sum: int, steps: int) -> np.ndarray:
    return np.array([
        lm.step_time(StepShape(num_decode=batch, decode_context=context_sum + j * batch, num_seqs=batch))
        for j in range(steps)
    ])


@given(
    model=st.sampled_from(REQUIRED_MODELS),
    gpu=st.sampled_from(REQUIRED_GPUS),
    tp=st.sampled_from([1, 2, 4, 8]),
    kv_fp8=st.booleans(),
    fp8=st.booleans(),
    norm=st.sampled_from([2.0, 3.0, float("inf")]),
    batch=st.integers(1, 1024),
    context_per_seq=st.integers(1, 32768),
    steps=st.integers(1, 64),
)
def test_decode_run_times_equals_step_time_loop(model, gpu, tp, kv_fp8, fp8, norm, batch, context_per_seq, steps):
    lm = roofline(model, gpu, tp=tp, kv_fp8=kv_fp8, fp8=fp8, roofline_norm=norm)
    context_sum = batch * context_per_seq
    run = lm.decode_run_times(batch, context_sum, steps)
    assert isinstance(run, np.ndarray) and run.shape == (steps,)
    np.testing.assert_allclose(run, _loop(lm, batch, context_sum, steps), rtol=1e-12, atol=0)


@given(base=st.floats(0, 0.1), per_token=st.floats(0, 1e-3), batch=st.integers(1, 512), steps=st.integers(1, 32))
def test_linear_step_model_decode_run_matches_loop(base, per_token, batch, steps):
    lm = LinearStepModel(base_s=base, per_token_s=per_token)
    np.testing.assert_allclose(lm.decode_run_times(batch, 100 * batch, steps), _loop(lm, batch, 100 * batch, steps))


def test_decode_run_times_is_nondecreasing():
    lm = roofline("Llama-3-70B", "H100-SXM", tp=4)
    run = lm.decode_run_times(128, 128 * 2000, 500)
    assert np.all(np.diff(run) >= 0)
