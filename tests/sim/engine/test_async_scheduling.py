"""Async scheduling (vLLM 0.33 v1/engine/core.py step_with_batch_queue, v1/core/sched/async_scheduler.py):
the host's work overlaps the GPU's in the step time, and schedule(N+1) runs before step N's output is applied,
so a request finished by step N still holds its blocks and running slot in that schedule()."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.latency import LatencyCoefficients, RooflineModel, StepShape
from sim.profiles import load_gpu, load_model
from sim.workload.classes import RequestClass
from tests.sim.engine.conftest import make_sim, make_workload

MODELS = ["Llama-3-8B", "Llama-3-70B"]
GPUS = ["H100-SXM", "A100-80GB", "L40S"]


def _pair(model, gpu, tp=1, **coef):
    c = LatencyCoefficients(**coef)
    m, g = load_model(model), load_gpu(gpu)
    return (RooflineModel(m, g, tensor_parallel=tp, coefficients=c),
            RooflineModel(m, g, tensor_parallel=tp, coefficients=c, async_scheduling=True))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), tp=st.sampled_from([1, 2, 4, 8]),
       batch=st.integers(1, 1024), ctx=st.integers(1, 8192), prefill=st.integers(0, 4096))
def test_async_step_is_the_longer_part_plus_the_exposed_host_time(model, gpu, tp, batch, ctx, prefill):
    sync, asyn = _pair(model, gpu, tp)
    c = sync.coefficients
    shape = StepShape(num_decode=batch, decode_context=batch * ctx, num_seqs=batch + (1 if prefill else 0),
                      prefill_tokens=prefill, prefill_attention=prefill * prefill / 2, prefill_context=prefill)
    host = c.overhead_s + c.per_seq_overhead_s * shape.num_seqs
    t_sync, t_async = sync.step_time(shape), asyn.step_time(shape)
    gpu_part = t_sync - host
    assert gpu_part > 0
    assert np.isclose(t_async, max(host, gpu_part) + c.async_exposed_s, rtol=1e-12)
    # Overlap never makes a step slower than running the two parts back to back (exposed part < either).
    assert t_async < t_sync


@settings(max_examples=60, deadline=None, derandomize=True)
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), batch=st.integers(1, 2048),
       ctx=st.integers(1, 4096), steps=st.integers(1, 64), per_seq=st.sampled_from([15e-6, 200e-6]))
def test_async_decode_runs_match_step_time_loop(model, gpu, batch, ctx, steps, per_seq):
    _, lm = _pair(model, gpu, per_seq_overhead_s=per_seq)
    context = batch * ctx
    loop = np.array([lm.step_time(StepShape(num_decode=batch, decode_context=context + j * batch, num_seqs=batch))
                     for j in range(steps)])
    np.testing.assert_allclose(lm.decode_run_times(batch, context, steps), loop, rtol=1e-12)
    affine = lm.decode_run_affine(batch, context)
    if affine is not None:  # only while the GPU part is the longer one
        first, inc = affine
        np.testing.assert_allclose(first + inc * np.arange(steps), loop, rtol=1e-9)
    else:
        assert loop[0] - lm.coefficients.async_exposed_s <= lm._decode_parts(batch)[0] + 1e-15


def test_async_hides_the_host_overhead_at_batch_one():
    # vLLM 0.21 ITL for Llama-3.1-8B on an H100 at concurrency 1 is 6.48 ms (benchmarks/data/vllm_measured.yaml);
    # the sum of host and GPU parts overshoots it, the overlap does not.
    sync, asyn = _pair("Llama-3-8B", "H100-SXM")
    shape = StepShape(num_decode=1, decode_context=600, num_seqs=1)
    assert sync.step_time(shape) - asyn.step_time(shape) > 1.5e-3


def _first_scheduled(async_scheduling: bool):
    # Request 0 finishes after 2 tokens while request 1 keeps running; request 2 waits for a slot
    # (max_num_seqs=2).  Constant 10 ms steps.
    wl = make_workload([(0.0, 16, 2), (0.0, 16, 30), (0.001, 16, 4)])
    sim = make_sim(wl, max_num_seqs=2, enable_prefix_caching=False, async_scheduling=async_scheduling)
    steps = []
    sim.core.observer = lambda i, now, out: steps.append((now, sorted(r.request_id for r, _ in out.scheduled)))
    sim.core.batch_decode_runs = False
    result = sim.run()
    return result.requests.set_index("request_id"), steps


def test_a_finished_request_holds_its_slot_for_one_more_schedule():
    sync_table, sync_steps = _first_scheduled(False)
    async_table, async_steps = _first_scheduled(True)
    # Sync: request 0 finishes at the end of step 2 (prefill, then one decode) and request 2 is admitted in step 3.
    assert sync_steps[2] == (0.02, [1, 2])
    # Async: schedule(3) runs before update_from_output(2) frees request 0: request 2 waits one more step.
    assert async_steps[2] == (0.02, [1])
    assert async_steps[3] == (0.03, [1, 2])
    assert async_table.loc[2, "first_scheduled_s"] - sync_table.loc[2, "first_scheduled_s"] == pytest.approx(0.01)
    # Request 0 itself finished at the same time either way (its token came out at the end of step 2).
    assert async_table.loc[0, "end_s"] == sync_table.loc[0, "end_s"] == 0.02
    assert (async_table["status"] == "finished").all()


def test_no_stall_when_the_held_slot_was_the_only_thing_in_the_way():
    # max_num_seqs=1: the finished request's held slot blocks everything; vLLM's empty schedule is followed at
    # once by the update that frees it, so the waiting request starts without a step in between.
    wl = make_workload([(0.0, 16, 2), (0.001, 16, 3)])
    sim = make_sim(wl, max_num_seqs=1, enable_prefix_caching=False, async_scheduling=True)
    sim.core.batch_decode_runs = False
    table = sim.run().requests.set_index("request_id")
    assert table.loc[1, "first_scheduled_s"] == table.loc[0, "end_s"] == 0.02
    assert sim.core.scheduler.pool.num_used == 0 and not sim.core.scheduler.deferred_free


def _run_rows(rows, batch_runs: bool, **knobs):
    sim = make_sim(make_workload(rows), enable_prefix_caching=False, async_scheduling=True, **knobs)
    sim.core.batch_decode_runs = batch_runs
    result = sim.run()
    return result.requests.set_index("request_id"), result.steps


def test_the_step_after_a_finish_starts_a_decode_run_when_nothing_waits():
    # Request 0 finishes after 2 tokens; request 1 decodes on alone with nobody waiting.  The schedule() that
    # still counts request 0's held slot and blocks decides what the steps after it decide (nothing can be
    # admitted), so it opens the run: prefill, one decode, then one run of the 28 decodes left.
    rows = [(0.0, 16, 2), (0.0, 16, 30)]
    batched, steps = _run_rows(rows, True)
    single, single_steps = _run_rows(rows, False)
    assert steps["num_steps"].tolist() == [1, 1, 28]
    assert len(single_steps) == 30 and int(single_steps["num_steps"].sum()) == 30
    assert batched["end_s"].tolist() == pytest.approx(single["end_s"].tolist(), abs=1e-12)
    assert batched["generated_tokens"].tolist() == single["generated_tokens"].tolist() == [2, 30]
    # With a CPU offload tier too (a run stores to it once per step, as single steps do).
    offload, offload_steps = _run_rows(rows, True, kv_offloading_size_gb=0.05)
    offload_single, _ = _run_rows(rows, False, kv_offloading_size_gb=0.05)
    assert offload_steps["num_steps"].tolist() == [1, 1, 28]
    assert offload["swapped_out_blocks"].tolist() == offload_single["swapped_out_blocks"].tolist() == [1, 2]


def test_the_step_after_a_finish_stays_single_while_a_request_waits():
    # As above with request 2 waiting for the slot (max_num_seqs=2): the schedule() after request 0's last
    # token cannot admit it (the held slot), the next one does, so that step must not open a run.
    rows = [(0.0, 16, 2), (0.0, 16, 30), (0.001, 16, 4)]
    batched, steps = _run_rows(rows, True, max_num_seqs=2)
    single, _ = _run_rows(rows, False, max_num_seqs=2)
    assert steps["num_steps"].tolist()[:3] == [1, 1, 1]
    assert batched.loc[2, "first_scheduled_s"] == single.loc[2, "first_scheduled_s"] == pytest.approx(0.03)
    assert batched["end_s"].tolist() == pytest.approx(single["end_s"].tolist(), abs=1e-12)


def _steps(rows, async_scheduling: bool, classes=None, **knobs):
    """Step by step (no decode runs): the table and, per schedule(), (time, scheduled (id, tokens), preempted ids)."""
    sim = make_sim(make_workload(rows, classes), async_scheduling=async_scheduling, **knobs)
    sim.core.batch_decode_runs = False
    steps = []
    sim.core.observer = lambda i, now, out: steps.append(
        (round(now, 9), [(r.request_id, n) for r, n in out.scheduled], [r.request_id for r in out.preempted]))
    return sim.run().requests.set_index("request_id"), steps


def test_an_abort_is_taken_after_the_next_schedule_and_drops_the_last_token():
    # vLLM 0.33 v1/engine/core.py step_with_batch_queue: schedule(N+1), then _process_aborts_queue(), then
    # update_from_output(N), which skips the aborted request.  The deadline (0.025 s) falls in step 2.
    classes = {"c": RequestClass("c", timeout_s=0.025)}
    sync, sync_steps = _steps([(0.0, 16, 100, "c")], False, classes, enable_prefix_caching=False)
    asyn, async_steps = _steps([(0.0, 16, 100, "c")], True, classes, enable_prefix_caching=False)
    # Sync: step 2's token is applied, then the abort comes before schedule(3).
    assert [t for t, _, _ in sync_steps] == [0.0, 0.01, 0.02]
    assert sync.loc[0, "generated_tokens"] == 3
    # Async: schedule(3) still puts it in the batch (that step runs), the abort follows, step 2's token is dropped.
    assert async_steps[-1] == (0.03, [(0, 1)], [])
    assert asyn.loc[0, "generated_tokens"] == 2
    assert sync.loc[0, "status"] == asyn.loc[0, "status"] == "timed_out"
    assert sync.loc[0, "end_s"] == asyn.loc[0, "end_s"] == 0.025


def test_a_request_finished_by_the_previous_step_is_the_first_victim():
    # vLLM's running list still holds request 1 (finished by step 2, admitted after request 0) at schedule(3):
    # request 0 needs a block, none is free, and the victim is running[-1], request 1.  It counts a preemption
    # and still finishes (its output is delivered as stale).  Sync: request 1 was freed before schedule(3).
    rows = [(0.0, 14, 18), (0.0, 10, 3)]
    knobs = dict(num_gpu_blocks_override=3, max_model_len=32, enable_prefix_caching=False)
    sync, sync_steps = _steps(rows, False, **knobs)
    asyn, async_steps = _steps(rows, True, **knobs)
    assert sync["num_preemptions"].tolist() == [0, 0]
    assert async_steps[3] == (0.03, [(0, 1)], [1])
    assert asyn["num_preemptions"].tolist() == [0, 1]
    assert (asyn["status"] == "finished").all()
    assert asyn["end_s"].tolist() == sync["end_s"].tolist()


def test_a_decode_block_is_hashed_one_step_late():
    # Request 2's decode fills its first block in step 2; at schedule(3) it needs a second one and preempts
    # itself.  Sync: allocate_slots hashed that block in schedule(2), so it resumes with a 16-token hit.  Async:
    # the token that fills it was a placeholder then (v1/core/sched/async_scheduler.py), and the request is
    # preempted before schedule(3) or update_from_output(2) hashes it: it resumes with no hit.
    rows = [(0.0, 2, 5), (0.0, 2, 20), (0.0, 14, 10)]
    knobs = dict(num_gpu_blocks_override=4, max_model_len=32, enable_prefix_caching=True)
    sync, sync_steps = _steps(rows, False, **knobs)
    asyn, async_steps = _steps(rows, True, **knobs)
    assert sync_steps[3][2] == async_steps[3][2] == [2]
    assert sync.loc[2, "preempted_hit_tokens"] == 16
    assert asyn.loc[2, "preempted_hit_tokens"] == 0
    assert (2, 17) in async_steps[6][1]


@pytest.mark.parametrize("batch_runs", [False, True])
def test_a_dropped_token_takes_its_gap_and_time_with_it(batch_runs):
    # The token that update_from_output(N) skips for a request aborted after schedule(N+1) never reaches the
    # client: neither its time nor its gap counts.  Twelve decodes (the decode columns' path) time out in step 2,
    # made long by a prefill chunk that joined it (0.01 s + 384 tokens x 10 us); request 12, admitted in step 1,
    # times out before its second token.  Step 1: 12 decodes + request 12's 40-token prefill.
    classes = {"c": RequestClass("c", timeout_s=0.025), "d": RequestClass("d")}
    rows = [(0.0, 16, 100, "c")] * 12 + [(0.005, 40, 100, "c"), (0.015, 3000, 4, "d")]
    sim = make_sim(make_workload(rows, classes), per_token_s=1e-5, async_scheduling=True,
                   enable_prefix_caching=False, max_num_seqs=16, max_num_batched_tokens=32 * 12)
    sim.core.batch_decode_runs = batch_runs
    reqs = sim.run().requests.set_index("request_id")
    assert set(reqs.index[reqs["status"] == "timed_out"]) == set(range(13))
    steady = reqs.loc[range(12)]
    assert (steady["generated_tokens"] == 2).all()
    assert steady["max_itl_s"].to_numpy() == pytest.approx(0.01 + 52e-5, rel=1e-9)  # step 1, not step 2 (0.01384)
    assert reqs.loc[12, "generated_tokens"] == 1 and np.isnan(reqs.loc[12, "max_itl_s"])
