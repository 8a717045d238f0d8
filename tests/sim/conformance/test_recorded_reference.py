"""kvtune's ``vllm-v1`` flavor against decisions recorded from vLLM 0.33.0's real V1 scheduler.

The data in ``data/`` was produced by ``benchmarks/conformance/run.py --record`` (the reference replay script,
or the project's lock-step driver, stepping vLLM's own ``Scheduler`` on a CPU, no model): a 40-request trace
and a few configs, from ample KV blocks to scarce ones with preemptions, with the watermark, full-input
admission off, the priority policy, prefix caching and a long-prefill cap; a 60-request trace whose prompts
share prefixes (hash ids: vLLM's real prefix cache hits them across requests); the same with client deadlines
(vLLM aborts with ``finish_requests`` at the step boundary); and the 40-request trace through vLLM 0.8.5's V0
scheduler (recompute and swap, chunked and not, swap space running out).  No vLLM import here: the test only replays
kvtune and compares, step by step, the scheduled requests and token counts, the preempted requests, the free
blocks after each ``schedule()`` and the prefix-hit tokens of every admission, and per request the preemption
count, first-token step, finish step, final status and abort step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.conformance.conformance import (  # noqa: E402
    STEP_BASE_S,
    STEP_PER_TOKEN_S,
    compare,
    compare_batched,
    config_from_dict,
    load_vllm_result,
    run_kvtune,
    run_kvtune_batched,
    vllm_request_times,
)
from benchmarks.conformance.traces import ARRIVAL_NUDGE_S, on_time_grid, read_trace  # noqa: E402

DATA = Path(__file__).parent / "data"
CASES = json.loads((DATA / "cases.json").read_text())


@pytest.fixture(scope="module", params=CASES, ids=[c["name"] for c in CASES])
def case(request):
    spec = request.param
    trace = read_trace(str(DATA / spec["trace"]))
    config = config_from_dict(spec["config"])
    vllm = load_vllm_result(str(DATA / spec["dir"]))
    return spec, trace, config, vllm


def test_every_step_matches_vllm(case):
    spec, trace, config, vllm = case
    kv = run_kvtune(trace, config, spec["max_model_len"])
    result = compare(vllm, kv)
    assert result["first_divergence"] is None, f"{spec['name']}: {result['first_divergence']}"
    assert result["steps_vllm"] == result["steps_kvtune"] > 0
    assert result["share_identical"] == 1.0
    if result["hits_recorded"]:
        assert result["share_same_hits"] == 1.0
        assert result["prefix_hit_tokens_vllm"] == result["prefix_hit_tokens_kvtune"]


def test_per_request_outcomes_match_vllm(case):
    spec, trace, config, vllm = case
    kv = run_kvtune(trace, config, spec["max_model_len"])
    assert kv.preemptions == vllm.preemptions
    assert kv.first_token_step == vllm.first_token_step
    assert kv.finish_step == vllm.finish_step
    summary = json.loads((DATA / spec["dir"] / "summary.json").read_text())
    if "engine_aborted" in summary:  # V0: vLLM raises when swap space runs out; kvtune's engine stops too
        assert bool(kv.extra["aborted"]) == bool(summary["engine_aborted"])
    if vllm.status:  # recorded by the lock-step driver or the V0 side: aborts, rejections, unfinished
        assert kv.status == vllm.status
        assert kv.abort_step == vllm.abort_step
        assert all(kv.finish_step[r] >= 0 for r, s in kv.status.items() if s == "finished")
    else:
        assert all(step >= 0 for step in kv.finish_step.values()), "every request finishes"


def test_batched_decode_runs_give_the_same_outcome(case):
    """Studies batch identical decode steps; preemptions and finish times must not change."""
    spec, trace, config, _ = case
    requests = run_kvtune_batched(trace, config, spec["max_model_len"])
    result = compare_batched(vllm_request_times(str(DATA / spec["dir"]), config), requests)
    assert result["batched_requests_preemption_count_differs"] == 0
    assert result["batched_first_token_time_differs"] == 0
    assert result["batched_end_time_differs"] == 0


def test_recorded_reference_exercises_preemption():
    totals = {c["name"]: json.loads((DATA / c["dir"] / "summary.json").read_text())["total_preemptions"] for c in CASES}
    assert totals["tiny/ample"] == 0
    assert sum(1 for n in totals.values() if n >= 5) >= 3, totals
    policies = {c["config"]["policy"] for c in CASES}
    assert policies == {"fcfs", "priority"}
    assert any(c["config"]["prefix_caching"] for c in CASES)
    # Prefix sharing across requests and client aborts are exercised.
    shared = [c for c in CASES if c["config"].get("hash_block_tokens") and c["config"]["prefix_caching"]]
    assert shared and all(load_vllm_result(str(DATA / c["dir"])).steps for c in shared)
    assert sum(sum((s["hits"] or {}).values()) for c in shared for s in load_vllm_result(str(DATA / c["dir"])).steps) > 0
    aborts = [json.loads((DATA / c["dir"] / "summary.json").read_text()).get("aborted", 0) for c in CASES]
    assert sum(aborts) >= 20
    # V0 (vLLM 0.8.5): recompute and swap, chunked and not, and swap space running out.
    v0 = [c for c in CASES if c["config"].get("flavor") == "vllm-v0"]
    assert {(c["config"]["preemption_mode"], c["config"]["chunked_prefill"]) for c in v0} == {
        ("recompute", False), ("recompute", True), ("swap", False), ("swap", True)}
    assert any(json.loads((DATA / c["dir"] / "summary.json").read_text())["engine_aborted"] for c in v0)


def test_time_grid_keeps_arrivals_off_step_boundaries():
    """The lock-step convention: arrivals are distinct, exact, and never on a step boundary (which is the
    last idle jump's arrival plus a whole number of 2**-16 s ticks, the step-time coefficients being dyadic)."""
    rng = np.random.default_rng(0)
    arrivals = on_time_grid(np.sort(rng.uniform(0, 500, 2000)))
    assert np.all(np.diff(arrivals) > 0)
    tick = STEP_PER_TOKEN_S
    assert (STEP_BASE_S / tick).is_integer()
    phase = np.mod(arrivals, tick) / ARRIVAL_NUDGE_S  # position inside a tick, in nudge units (exact)
    assert np.all(phase == np.round(phase))
    # Two arrivals in the same phase would let a boundary started at one land on the other; the replay script
    # also counts an arrival up to 1e-12 s late as due, so phases must be farther apart than that.
    ticks = tick / ARRIVAL_NUDGE_S
    p = np.sort(phase)
    gaps = np.append(np.diff(p), p[0] + ticks - p[-1])
    assert gaps.min() * ARRIVAL_NUDGE_S > 1e-12
