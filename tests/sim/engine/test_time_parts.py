"""A step's duration split by what it served (``LatencyModel.step_parts``), and the per-request stall figures.

Properties: the parts are non-negative and sum to the step time for any shape, on every bundled GPU and TP
degree; in simulated runs every step-table row's parts sum to its duration, the requests' shares never exceed
the run's parts, and batching decode runs changes no request's longest gap or preempted time.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.latency import PART_NAMES, LinearStepModel, RooflineModel, StepShape
from sim.profiles import load_gpu, load_model
from sim.tables import REQUEST_TIME_COLUMNS
from tests.sim.engine.conftest import make_sim, make_workload
from tests.sim.engine.test_invariants import _run_checked, configs, workloads
from tests.sim.latency._helpers import decode, prefill, roofline

MODELS = [roofline("Llama-3-8B", "L40S"), roofline("Llama-3-70B", "H100-SXM", tp=4), roofline("Mixtral-8x7B", "H200", tp=2),
          roofline("Qwen2.5-7B", "A100-80GB", fp8=True), LinearStepModel(0.01, 1e-4),
          RooflineModel(load_model("Llama-3-8B"), load_gpu("H100-SXM"), async_scheduling=True)]


@st.composite
def shapes(draw):
    shape = StepShape()
    for _ in range(draw(st.integers(0, 4))):  # prefill chunks, each part recompute
        chunk, before = draw(st.integers(1, 4096)), draw(st.integers(0, 8192))
        recompute = draw(st.sampled_from([0, chunk, chunk // 2]))
        shape.prefill_tokens += chunk
        shape.prefill_attention += chunk * (before + chunk / 2)
        shape.prefill_context += before + chunk
        shape.num_seqs += 1
        if recompute:
            shape.recompute_tokens += recompute
            shape.recompute_attention += recompute * (before + recompute / 2)
            shape.recompute_context += before + recompute
    batch = draw(st.integers(0, 512))
    shape.num_decode, shape.decode_context, shape.num_seqs = batch, batch * draw(st.integers(1, 16384)), shape.num_seqs + batch
    shape.swap_blocks = draw(st.sampled_from([0, 0, 1, 64, 4096]))
    shape.swap_copies = shape.swap_blocks * draw(st.sampled_from([1, 64]))
    return shape


@settings(max_examples=300, deadline=None, derandomize=True)
@given(shape=shapes(), which=st.integers(0, len(MODELS) - 1))
def test_parts_are_non_negative_and_sum_to_the_step_time(shape, which):
    model = MODELS[which]
    parts = model.step_parts(shape)
    total = model.step_time(shape)
    assert parts.total_s == pytest.approx(total, rel=1e-9, abs=1e-15)
    assert all(p >= -1e-12 * max(total, 1.0) for p in parts.as_tuple()), parts
    if not shape.recompute_tokens:
        assert parts.recompute_s == 0.0
    if shape.recompute_tokens == shape.prefill_tokens:
        assert parts.prefill_new_s == 0.0
    if not shape.swap_blocks:
        assert parts.transfer_s == 0.0


def test_the_issue_step_on_an_l40s():
    """1,500 recompute tokens (a resumed 1.5k-token request) with 60 decodes at 3k context: the recompute's share
    of the time is what it adds to the decodes alone, far below its 96% share of the tokens."""
    model = MODELS[0]
    step = prefill(1500)
    step.recompute_tokens, step.recompute_attention, step.recompute_context = 1500, step.prefill_attention, 1500
    mixed = decode(60, 3000)
    for name in ("prefill_tokens", "prefill_attention", "prefill_context", "recompute_tokens", "recompute_attention",
                 "recompute_context"):
        setattr(mixed, name, getattr(step, name))
    mixed.num_seqs += 1
    parts, total = model.step_parts(mixed), model.step_time(mixed)
    decodes_alone = model.step_time(decode(60, 3000))
    assert parts.recompute_s == pytest.approx(total - decodes_alone)
    assert parts.decode_s + parts.overhead_s == pytest.approx(decodes_alone)
    assert parts.recompute_s / total < 0.75 < 1500 / 1560


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_step_rows_sum_to_their_duration_and_requests_share_them(workload, config_and_runs):
    config, batch_runs = config_and_runs
    _, result = _run_checked(workload, config, batch_runs)
    steps, reqs = result.steps, result.requests
    parts = steps[[f"time_{p}_s" for p in PART_NAMES]]
    assert np.allclose(parts.sum(axis=1), steps["duration_s"], rtol=1e-9, atol=1e-12)
    assert (parts.to_numpy() >= -1e-12).all()
    for part in ("prefill_new", "recompute", "decode", "overhead"):
        assert reqs[f"time_{part}_s"].sum() <= steps[f"time_{part}_s"].sum() + 1e-9
    assert reqs["time_recompute_s"].sum() == pytest.approx(steps["time_recompute_s"].sum(), abs=1e-9)
    assert (reqs["preempted_s"] >= reqs["resume_wait_s"] - 1e-9).all()  # a stall lasts at least until the resume
    assert (reqs.loc[reqs["num_preemptions"] == 0, "preempted_s"] == 0).all()
    two = reqs["generated_tokens"] >= 2
    assert reqs.loc[two, "max_itl_s"].notna().all() and reqs.loc[~two, "max_itl_s"].isna().all()
    done = two & reqs["status"].eq("finished")
    assert (reqs.loc[done, "max_itl_s"] >= reqs.loc[done, "tpot_s"] - 1e-9).all()  # the longest gap >= the mean


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_batched_decode_runs_keep_gaps_stalls_and_time_shares(workload, config_and_runs):
    config, _ = config_and_runs
    _, batched = _run_checked(workload, config, True)
    _, single = _run_checked(workload, config, False)
    cols = ["max_itl_s", "preempted_s", *REQUEST_TIME_COLUMNS]
    assert np.allclose(batched.requests[cols].fillna(-1), single.requests[cols].fillna(-1), rtol=1e-9, atol=1e-9)


def test_a_preempted_request_shows_its_stall_and_its_gap():
    """Two requests grow into a cache too small for both: one is preempted, waits, recomputes; its stall is
    the time from preemption to its next token, and its longest gap covers it."""
    workload = make_workload([(0.0, 40, 60), (0.0, 40, 60)])
    sim = make_sim(workload, step_s=0.01, per_token_s=1e-4, block_size=16, num_gpu_blocks_override=9, max_model_len=128)
    reqs = sim.run().requests
    victim = reqs.loc[reqs["num_preemptions"].idxmax()]
    assert victim["num_preemptions"] >= 1
    assert victim["preempted_s"] > victim["resume_wait_s"] > 0  # waited, then recomputed before a new token
    assert victim["max_itl_s"] >= victim["preempted_s"] - 1e-9
    assert victim["time_recompute_s"] > 0
    other = reqs.loc[reqs["num_preemptions"].idxmin()]
    if other["num_preemptions"] == 0:
        assert other["max_itl_s"] < victim["max_itl_s"] and other["preempted_s"] == 0


def test_async_scheduling_hides_the_host_overhead_from_the_busy_time():
    shape = decode(64, 2000)
    sync, hidden = MODELS[0].__class__(load_model("Llama-3-8B"), load_gpu("H100-SXM")), MODELS[-1]
    a, b = sync.step_parts(shape), hidden.step_parts(shape)
    c = hidden.coefficients
    assert a.overhead_s == pytest.approx(sync.overhead_time(shape))
    assert b.overhead_s == pytest.approx(sync.overhead_time(shape) - (c.overhead_s - c.async_exposed_s))
    assert b.total_s == pytest.approx(hidden.step_time(shape))
    assert b.total_s < a.total_s
