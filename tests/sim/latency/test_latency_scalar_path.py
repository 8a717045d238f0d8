"""``RooflineModel.step_time`` computes one step on floats (``_time_s``, ``_gpu_time_s``, ``_roof_s``: C doubles in the
compiled engine); ``_time`` and ``_decode_time`` are the same formulas for floats or arrays, on Python objects.  The
step table and every request's time shares come from ``step_time``, so the two must agree exactly, not to a
tolerance: both are checked here on the same shapes, across models (MoE: the ``**`` of touched experts), tensor
parallelism (the all-reduce term), fp8, roofline norms (2: ``sqrt``, inf: ``max``, 3: ``**``), async scheduling
(``_combine``) and the per-prefill-sequence overhead."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.sim.latency._helpers import REQUIRED_GPUS, REQUIRED_MODELS

from sim.latency import LatencyCoefficients, RooflineModel, StepShape
from sim.profiles import load_gpu, load_model


def _model(model, gpu, tp, fp8, norm, async_scheduling, per_prefill_seq):
    coef = LatencyCoefficients(roofline_norm=norm, per_prefill_seq_overhead_s=per_prefill_seq)
    return RooflineModel(load_model(model), load_gpu(gpu), tensor_parallel=tp, weight_dtype_bytes=1 if fp8 else 2,
                         coefficients=coef, async_scheduling=async_scheduling)


def _reference(lm: RooflineModel, shape: StepShape) -> float:
    """``step_time`` through the object formulas (``_time``, ``_decode_time``), as before the float path."""
    if shape.prefill_tokens + shape.num_decode == 0:
        return lm.swap_time(shape.swap_blocks, shape.swap_copies) if shape.swap_blocks else 0.0
    if (not shape.prefill_tokens and shape.num_decode and shape.num_seqs == shape.num_decode
            and not shape.prefill_attention and not shape.prefill_context):
        t = float(lm._decode_time(shape.num_decode, shape.decode_context))
    else:
        num_seqs = shape.num_seqs or (shape.num_decode + (1 if shape.prefill_tokens else 0))
        t = float(lm._time(float(shape.prefill_tokens + shape.num_decode), float(num_seqs),
                           float(shape.prefill_attention), float(shape.prefill_context), float(shape.decode_context),
                           float(num_seqs - shape.num_decode) if shape.prefill_tokens else 0.0))
    if shape.swap_blocks:
        t += lm.swap_time(shape.swap_blocks, shape.swap_copies)
    return t


_models = st.builds(_model, model=st.sampled_from(REQUIRED_MODELS), gpu=st.sampled_from(REQUIRED_GPUS),
                    tp=st.sampled_from([1, 2, 8]), fp8=st.booleans(), norm=st.sampled_from([2.0, 3.0, float("inf")]),
                    async_scheduling=st.booleans(), per_prefill_seq=st.sampled_from([0.0, 4e-3]))


@st.composite
def _shapes(draw):
    num_decode = draw(st.integers(0, 512))
    decode_context = num_decode * draw(st.integers(1, 32768))
    chunks = draw(st.integers(0, 4))
    prefill = sum(draw(st.lists(st.integers(1, 8192), min_size=chunks, max_size=chunks)))
    before = draw(st.integers(0, 65536))
    return StepShape(prefill_tokens=prefill, prefill_attention=prefill * (before + prefill / 2) if prefill else 0.0,
                     prefill_context=before + prefill if prefill else 0, num_decode=num_decode,
                     decode_context=decode_context, num_seqs=num_decode + chunks,
                     swap_blocks=draw(st.sampled_from([0, 0, 7, 300])), swap_copies=draw(st.integers(0, 64)))


@settings(max_examples=400, deadline=None)
@given(lm=_models, shape=_shapes())
def test_step_time_on_floats_is_the_object_formulas_exactly(lm, shape):
    got = lm.step_time(shape)
    assert type(got) is float
    assert got == _reference(lm, shape), (got, _reference(lm, shape))


def test_step_time_on_floats_matches_the_array_form_of_a_decode_run():
    """The decode branch against ``decode_run_times`` (arrays through ``_decode_time``), element by element."""
    for norm in (2.0, float("inf"), 3.0):
        lm = _model("Mixtral-8x7B", "H100-SXM", 2, False, norm, False, 0.0)
        run = lm.decode_run_times(96, 96 * 3000, 50)
        loop = np.array([lm.step_time(StepShape(num_decode=96, decode_context=96 * 3000 + j * 96, num_seqs=96))
                         for j in range(50)])
        assert np.array_equal(run, loop)
