"""Hand-worked cases of vLLM V1's scheduling rules (vllm/v1/core/sched/scheduler.py, 0.33.0)."""

from __future__ import annotations

from tests.sim.engine.conftest import make_sim, make_workload


def _steps_of(sim):
    """Run with an observer that keeps each step's scheduled (request_id, tokens) and preempted ids."""
    log = []

    def observe(iteration, now, out):
        log.append((now, [(r.request_id, n) for r, n in out.scheduled], [r.request_id for r in out.preempted]))

    sim.core.observer = observe
    sim.core.batch_decode_runs = False
    result = sim.run()
    return result, log


def test_last_running_request_is_preempted_and_requeued_at_front():
    # 6 usable blocks of 16 tokens (override 7: block 0 is the null block). Two requests of 40 prompt tokens
    # (3 blocks each) fill the cache; the first to need a 4th block (at 48 tokens) preempts the LAST running.
    wl = make_workload([(0.0, 40, 30), (0.0, 40, 30)])
    sim = make_sim(wl, num_gpu_blocks_override=7, max_model_len=64, enable_prefix_caching=False)
    result, log = _steps_of(sim)
    preemptions = [(i, p) for i, (_, _, p) in enumerate(log) if p]
    assert preemptions, "the cache is too small for both: someone must be preempted"
    first_step, victims = preemptions[0]
    assert victims == [1], "FCFS preempts the last running request, not the one asking"
    # The step that preempted admits nobody: request 1 is not scheduled in it.
    assert all(rid != 1 for rid, _ in log[first_step][1])
    # Request 0 keeps running to completion before request 1 resumes (front of the waiting queue).
    table = result.requests.set_index("request_id")
    assert table.loc[0, "num_preemptions"] == 0
    assert table.loc[1, "num_preemptions"] >= 1
    assert (table["status"] == "finished").all()
    assert table.loc[1, "recomputed_tokens"] > 0


def test_no_admission_in_a_step_that_preempted():
    wl = make_workload([(0.0, 40, 30), (0.0, 40, 30), (0.05, 8, 2)])
    sim = make_sim(wl, num_gpu_blocks_override=7, max_model_len=64, enable_prefix_caching=False)
    _, log = _steps_of(sim)
    for now, scheduled, preempted in log:
        if preempted:
            newly = [rid for rid, n in scheduled if n > 1]
            assert not newly, f"a prefill was admitted at t={now} in a step that preempted {preempted}"


def test_priority_policy_preempts_lowest_priority():
    from sim.workload.classes import RequestClass

    classes = {"hi": RequestClass("hi", priority=0), "lo": RequestClass("lo", priority=5)}
    # The low-priority request arrives first and runs; the high-priority one arrives, and when blocks run
    # out the low-priority one is the victim even though it is not last.
    wl = make_workload([(0.0, 40, 30, "lo"), (0.0, 40, 30, "hi")], classes)
    sim = make_sim(wl, num_gpu_blocks_override=7, max_model_len=64, enable_prefix_caching=False, scheduling_policy="priority")
    result, log = _steps_of(sim)
    victims = [v for _, _, p in log for v in p]
    assert victims and set(victims) == {0}
    assert result.requests.set_index("request_id").loc[1, "num_preemptions"] == 0


def test_priority_ties_in_arrival_go_to_the_later_request_and_end():
    """Two requests of one priority arriving at the same instant that cannot fit together: vLLM stamps arrivals one
    after another, so the later one is the victim each time and the earlier one finishes.  Breaking the tie by
    running order instead made them preempt each other forever (a hypothesis example ran out of memory on CI)."""
    wl = make_workload([(0.1, 179, 5), (0.1, 200, 38)])
    sim = make_sim(wl, block_size=8, max_model_len=256, num_gpu_blocks_override=33, max_num_seqs=9,
                   max_num_batched_tokens=48, long_prefill_token_threshold=24, enable_prefix_caching=False,
                   scheduling_policy="priority")
    steps = [0]

    def bounded(iteration, now, out):
        steps[0] += 1
        assert steps[0] < 1000, "the two requests keep preempting each other"

    sim.core.observer = bounded
    req = sim.run().requests.set_index("request_id")
    assert (req["status"] == "finished").all()
    assert req.loc[0, "num_preemptions"] == 0


def test_prefix_cache_lets_a_resumed_request_rehit_its_blocks():
    wl = make_workload([(0.0, 40, 30), (0.0, 40, 30)])
    with_cache = make_sim(wl, num_gpu_blocks_override=7, max_model_len=64, enable_prefix_caching=True).run()
    without = make_sim(wl, num_gpu_blocks_override=7, max_model_len=64, enable_prefix_caching=False).run()
    assert without.requests["num_preemptions"].sum() >= 1
    # Its re-hit is a resumption's (vLLM's preempted_hits), not an exported prefix-cache hit (test_prefix_pressure.py).
    assert with_cache.requests["preempted_hit_tokens"].sum() > 0
    assert with_cache.requests["prefix_hit_tokens"].sum() == 0
    assert with_cache.requests["recomputed_tokens"].sum() < without.requests["recomputed_tokens"].sum()


def test_full_input_admission_waits_for_whole_prompt():
    # 10 usable blocks; request 0 (100 tokens = 7 blocks) runs; request 1 (60 tokens = 4 blocks) could start a
    # first chunk but its full input does not fit next to request 0, so it waits with reserve_full_isl on.
    wl = make_workload([(0.0, 100, 20), (0.001, 60, 5)])
    on = make_sim(wl, num_gpu_blocks_override=11, max_model_len=128, max_num_batched_tokens=32, max_num_seqs=16,
                  enable_prefix_caching=False)
    off = make_sim(wl, num_gpu_blocks_override=11, max_model_len=128, max_num_batched_tokens=32, max_num_seqs=16,
                   enable_prefix_caching=False, scheduler_reserve_full_isl=False)
    r_on = on.run().requests.set_index("request_id")
    r_off = off.run().requests.set_index("request_id")
    assert r_on.loc[1, "first_scheduled_s"] > r_off.loc[1, "first_scheduled_s"]


def test_watermark_applies_only_while_something_runs():
    # Watermark 0.5 of 10 blocks = 5: a 6-block prompt can start on an idle engine but not beside another.
    wl = make_workload([(0.0, 90, 40), (0.0, 90, 2)])
    sim = make_sim(wl, num_gpu_blocks_override=11, max_model_len=128, watermark=0.5, enable_prefix_caching=False)
    table = sim.run().requests.set_index("request_id")
    assert (table["status"] == "finished").all()
    # Request 1 had to wait for request 0 to finish.
    assert table.loc[1, "first_scheduled_s"] >= table.loc[0, "end_s"]


def test_token_budget_chunks_long_prompts():
    wl = make_workload([(0.0, 100, 3)])
    sim = make_sim(wl, max_num_batched_tokens=32, max_num_seqs=16, max_model_len=256, enable_prefix_caching=False)
    _, log = _steps_of(sim)
    chunks = [n for _, scheduled, _ in log for rid, n in scheduled]
    assert chunks[:4] == [32, 32, 32, 4]
    assert chunks[4:] == [1, 1]


def test_last_token_in_the_step_that_crosses_the_deadline_is_finished():
    # vLLM applies a step's output before an abort, which the engine takes between steps: a request whose
    # last token comes out of the step that crosses its deadline is finished, at the end of that step.
    from sim.workload.classes import RequestClass

    wl = make_workload([(0.0, 10, 5, "a")], {"a": RequestClass("a", timeout_s=0.045)})
    table = make_sim(wl, step_s=0.01, max_model_len=64, enable_prefix_caching=False).run().requests
    assert table.loc[0, "status"] == "finished"
    assert abs(table.loc[0, "end_s"] - 0.05) < 1e-12
    wl = make_workload([(0.0, 10, 6, "a")], {"a": RequestClass("a", timeout_s=0.045)})
    table = make_sim(wl, step_s=0.01, max_model_len=64, enable_prefix_caching=False).run().requests
    assert table.loc[0, "status"] == "timed_out"
    assert abs(table.loc[0, "end_s"] - 0.045) < 1e-12
