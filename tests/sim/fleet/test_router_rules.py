"""Each router's own rule on small hand-made cases, through the public interface (views in, replica out), and
what the views let a router see."""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.fleet import (FleetSimulation, ReplicaView, ReplicaViews, RequestView, make_router, replica_views,
                       simulate_fleet)
from sim.fleet._loop import (CountViews, DueHeap, MetricViews, RequestViews, least_costs, llm_d_ties, preroute,
                             refresh_counts)
from sim.fleet._routers import DynamoKV, LLMDWeighted
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.run_loop import HISTORY_TRIM, Published, RunRecord
from tests.sim.engine.conftest import make_workload

MODEL, GPU = load_model("Llama-3-8B"), load_gpu("H100-SXM")


def req(index=0, t=0.0, prompt=64, hashes=(), session=None, block=16):
    return RequestView(index=index, arrival_s=t, class_name="a", prompt_tokens=prompt, block_hashes=tuple(hashes),
                       block_size=block, session_id=session)


def views(outstanding=None, waiting=None, kv=None, n=None):
    n = n or len(outstanding or waiting or kv)
    outstanding = outstanding or [0] * n
    waiting = waiting or [0] * n
    kv = kv or [0.0] * n
    return [ReplicaView(index=i, routed=outstanding[i], outstanding=outstanding[i], num_waiting=waiting[i],
                        num_running=0, kv_usage=kv[i]) for i in range(n)]


def test_least_outstanding_and_least_kv():
    assert make_router("least_outstanding", {}, 3).route(req(), views(outstanding=[3, 1, 2])) == 1
    assert make_router("least_kv_usage", {}, 3).route(req(), views(kv=[0.5, 0.2, 0.9])) == 1


def test_ties_are_broken_at_random_but_reproducibly():
    picks = [make_router("least_kv_usage", {}, 4, seed=s).route(req(), views(n=4)) for s in range(40)]
    assert len(set(picks)) > 1
    assert picks == [make_router("least_kv_usage", {}, 4, seed=s).route(req(), views(n=4)) for s in range(40)]


def test_sglang_sends_a_shared_prefix_where_it_was_cached():
    router = make_router("sglang_cache_aware", {}, 3)
    prefix = [11, 12, 13, 14]
    # A miss (nothing cached yet) goes to the least loaded, the first of equals.
    assert router.route(req(0, 0.0, 80, prefix + [99]), views(n=3)) == 0
    # 4 of 5 blocks (64 of 80 tokens) match: 0.8 > cache_threshold 0.3, so to the prefix's owner despite its load.
    assert router.route(req(1, 1.0, 80, prefix + [98]), views(outstanding=[5, 0, 0])) == 0
    # A miss goes to the least loaded (0.3.2, sglang PR #14650), not to the smallest tree.
    assert router.route(req(2, 2.0, 80, [1, 2, 3, 4, 5]), views(outstanding=[0, 1, 0])) == 0
    assert router.route(req(3, 3.0, 80, [6, 7, 8, 9, 10]), views(outstanding=[2, 1, 1])) == 1
    # At most cache_threshold of the prompt matched is a miss: 1 of 5 blocks is 0.2.
    assert router.route(req(4, 4.0, 80, [11, 50, 51, 52, 53]), views(outstanding=[1, 1, 0])) == 2


def test_sglang_hit_goes_to_the_first_owner_of_the_deepest_matched_block():
    """One tree for all workers: the match is the longest prefix any worker was sent, and its tenant the worker
    whose request first reached the deepest matched block, even when another worker holds that prefix too."""
    prefix = [1, 2, 3, 4]
    tight = make_router("sglang_cache_aware", {"balance_abs_threshold": 0, "balance_rel_threshold": 1.0}, 2)
    assert tight.route(req(0, 0.0, 64, prefix), views(n=2)) == 0
    # Imbalanced: the same prefix (and block 5) goes to the least loaded, 1; both now hold blocks 1-4.
    assert tight.route(req(1, 1.0, 80, prefix + [5]), views(outstanding=[1, 0])) == 1
    # Balanced again: blocks 1-4 are 0's (it created them), block 5 is 1's.
    assert tight.route(req(2, 2.0, 80, prefix + [6]), views(outstanding=[1, 1])) == 0
    assert tight.route(req(3, 3.0, 96, prefix + [5, 7]), views(outstanding=[1, 1])) == 1


def test_sglang_falls_back_to_the_least_loaded_when_imbalanced():
    router = make_router("sglang_cache_aware", {}, 2)
    prefix = [1, 2, 3, 4]
    assert router.route(req(0, 0.0, 64, prefix), views(n=2)) == 0
    # Imbalance needs both (max - min) > 64 and max > 1.5 * min.
    assert router.route(req(1, 1.0, 64, prefix), views(outstanding=[64, 0])) == 0  # 64 - 0 is not > 64
    assert router.route(req(2, 2.0, 64, prefix), views(outstanding=[100, 40])) == 0  # 100 - 40 is not > 64
    assert router.route(req(3, 3.0, 64, prefix), views(outstanding=[110, 80])) == 0  # 110 < 1.5 * 80
    assert router.route(req(4, 4.0, 64, prefix), views(outstanding=[200, 100])) == 1  # 100 > 64 and 200 > 150
    small = make_router("sglang_cache_aware", {"balance_abs_threshold": 2, "balance_rel_threshold": 1.0}, 2)
    small.route(req(0, 0.0, 64, prefix), views(n=2))
    assert small.route(req(1, 1.0, 64, prefix), views(outstanding=[3, 0])) == 1


def test_llm_d_weights_prefix_against_load():
    router = make_router("llm_d_weighted", {}, 2)
    prefix = [1, 2, 3, 4]
    assert router.route(req(0, 0.0, 64, prefix), views(n=2, kv=[0.0, 0.1])) == 0  # kv: 2*1.0 vs 2*0.9
    # Full prefix on 0 (3 * 1.0) outweighs its longer queue (2 * 0 vs 2 * 1) and higher KV usage (2*.5 vs 2*.6).
    assert router.route(req(1, 1.0, 64, prefix), views(waiting=[4, 0], kv=[0.5, 0.2])) == 0
    # 3 (prefix) + 0 (queue) + 2*0.1 = 3.2 on replica 0 vs 0 + 2 + 2*1.0 = 4 on replica 1.
    assert router.route(req(2, 2.0, 64, prefix), views(waiting=[4, 0], kv=[0.9, 0.0])) == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_llm_d_scores_each_replica_as_written(data):
    """llm_d_weighted's one-pass scoring picks what scoring one replica at a time by the rule as written picks
    (3 * prefix + 2 * (1 - KV usage) + 2 * queue, the highest, ties drawn alike), over a run of requests with and
    without shared hashes, equal and unequal queues, round weights (ties) and arbitrary ones."""
    n = data.draw(st.sampled_from([1, 2, 5, 64]))
    params = {key: data.draw(_weights) for key in ("prefix_weight", "kv_weight", "queue_weight")}
    router, twin = make_router("llm_d_weighted", params, n, 7), make_router("llm_d_weighted", params, n, 7)
    pw, kw, qw = params["prefix_weight"], params["kv_weight"], params["queue_weight"]
    for i in range(data.draw(st.integers(1, 12))):
        bs = 16
        prompt = data.draw(st.integers(1, 100))
        blocks = prompt // bs
        hashes = tuple(data.draw(st.sampled_from([0, 1, 2])) * 100 + k for k in range(data.draw(st.integers(0, blocks))))
        waiting = data.draw(st.lists(st.sampled_from([0, 3]) | st.integers(0, 50), min_size=n, max_size=n))
        kv = data.draw(st.lists(st.sampled_from([0.0, 0.5]) | st.floats(0.0, 1.0), min_size=n, max_size=n))
        request = req(i, float(i), prompt, hashes)
        chosen = router.route(request, views(waiting=waiting, kv=kv))
        hi, lo = max(waiting), min(waiting)
        rule = [pw * (index.match(hashes, float(i)) / blocks if blocks else 0.0) + kw * (1.0 - kv[r])
                + qw * (1.0 if hi == lo else (hi - waiting[r]) / (hi - lo)) for r, index in enumerate(twin.indexes)]
        expected = twin._pick_min([-s for s in rule])
        twin.indexes[expected].insert(hashes, float(i))
        assert chosen == expected


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_llm_d_ties_are_the_rules_least_negated_scores(data):
    """``llm_d_ties`` gives the replicas at the least negated score as ``Router._pick_min`` finds them over the rule's
    scores (``LLMDWeighted``: ``3 * prefix + 2 * (1 - KV usage) + 2 * queue`` with int true divisions), in index
    order: its divisions as floats of ints below 2**53 (counts up to 2**53 here), a new least after ties, ties
    after a new least, all equal."""
    n = data.draw(st.integers(1, 70))
    counts = st.sampled_from([0, 1, 3]) | st.integers(0, 50) | st.integers(0, 2**53)
    waiting = data.draw(st.lists(counts, min_size=n, max_size=n))
    kv = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 1.0), min_size=n, max_size=n))
    blocks = data.draw(st.sampled_from([0, 1, 4]) | st.integers(0, 2**53))
    matched = data.draw(st.none() | st.lists(st.integers(0, 4) | st.integers(0, 2**53), min_size=n, max_size=n))
    pw, kw, qw = (data.draw(_weights) for _ in range(3))
    hi, lo = max(waiting), min(waiting)
    scores = [pw * (matched[r] / blocks if blocks and matched is not None else 0.0) + kw * (1.0 - kv[r])
              + qw * (1.0 if hi == lo else (hi - waiting[r]) / (hi - lo)) for r in range(n)]
    least = min(-s for s in scores)
    shown = replica_views([ReplicaView(r, 0, 0, waiting[r], 0, kv[r]) for r in range(n)])
    assert llm_d_ties(shown, matched, blocks, pw, kw, qw) == [r for r in range(n) if -scores[r] == least]


def test_llm_d_ties_divide_as_ints_divide():
    """The prefix and queue terms are ``a / b`` of ints, rounded once (49 / 49 is 1.0; ``49 * (1 / 49)`` is not):
    a replica whose full prefix or longest-free queue gives exactly 1.0 ties with one scoring 1.0 otherwise."""
    two = [ReplicaView(0, 0, 0, 0, 0, 1.0), ReplicaView(1, 0, 0, 0, 0, 0.0)]
    assert llm_d_ties(replica_views(two), [49, 0], 49, 1.0, 1.0, 0.0) == [0, 1]
    three = [ReplicaView(0, 0, 0, 0, 0, 1.0), ReplicaView(1, 0, 0, 49, 0, 0.0), ReplicaView(2, 0, 0, 49, 0, 1.0)]
    assert llm_d_ties(replica_views(three), None, 0, 0.0, 1.0, 1.0) == [0, 1]


def test_dynamo_credits_overlap_and_charges_load():
    router = make_router("dynamo_kv", {}, 2)
    prefix = list(range(10))
    assert router.route(req(0, 0.0, 160, prefix), views(n=2)) in (0, 1)
    home = router._live[0][0]
    router.on_first_token(0, home, 0.5)
    # 10 of 10 blocks cached at home: prefill 10 - 10 = 0, decode 10 + 10 = 20; elsewhere 10 + 0 + 10 = 20: a tie
    # broken at random; with a longer prompt that shares the prefix, home is cheaper.
    assert router.route(req(1, 1.0, 320, prefix + list(range(100, 110))), views(n=2)) == home
    # Load: many active blocks at home make a fresh prompt go elsewhere.
    assert router.route(req(2, 2.0, 160, range(200, 210)), views(n=2)) != home
    router.on_complete(0, home, 3.0)
    assert router.active_blocks[home] == 20 and router.prefill_tokens[home] == 320 - 160


_weights = st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0.0, 10.0)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_dynamo_least_costs_are_the_scans_ties(data):
    """The compiled pass (``least_costs``) and the scan compute the rule written out: the scan's every value, the
    compiled pass the same least cost's ties in index order, with and without overlaps, on round weights (ties) and
    arbitrary ones."""
    n = data.draw(st.sampled_from([1, 2, 8, 20, 64]))
    params = {"prefill_load_scale": data.draw(_weights), "overlap_credit": data.draw(_weights)}
    router = make_router("dynamo_kv", params, n)
    assert router._compiled
    loads = st.lists(st.sampled_from([0, 16, 64]) | st.integers(0, 10**6), min_size=n, max_size=n)
    prefill, active = data.draw(loads), data.draw(loads)
    router.prefill_tokens, router.active_blocks = list(prefill), list(active)
    bs = data.draw(st.sampled_from([1, 16, 64, 7]))
    prompt = data.draw(st.integers(1, 20_000))
    new_blocks = -(-prompt // bs)
    overlaps = data.draw(st.none() | st.lists(st.integers(0, 300), min_size=n, max_size=n))
    # Dynamo's worker_logit as written, worker by worker (no overlaps: 0 each).
    scale, credit = params["prefill_load_scale"], params["overlap_credit"]
    rule = [scale * max(0.0, (p + prompt) / bs - credit * o) + (a + new_blocks)
            for p, a, o in zip(prefill, active, overlaps or [0] * n)]
    assert router._costs_scan(prompt, bs, new_blocks, overlaps or [0] * n) == rule
    assert least_costs(prefill, active, overlaps, prompt, bs, new_blocks, scale, credit) == \
        [w for w, cost in enumerate(rule) if cost == min(rule)]


_hashes = st.lists(st.integers(0, 12), max_size=6).map(lambda xs: tuple(sorted(set(xs))))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.sampled_from([{}, {"prefill_load_scale": 2.0, "overlap_credit": 0.5, "ttl_s": 2.0}]),
       st.lists(st.tuples(_hashes, st.integers(1, 400), st.sampled_from([0, 1, 2, 3]), st.integers(0, 40)),
                min_size=1, max_size=40))
def test_dynamo_slot_manager_decides_as_the_rule_written(n, params, steps):
    """``DynamoKV``'s instance ``route`` and hooks (the compiled slot manager's, ``DynamoSlots``) and its class
    methods (the rule as written) make the same picks, draws and bookkeeping over a run of arrivals, first tokens
    and ends (ties at the start and among equal loads)."""
    fast, rule = make_router("dynamo_kv", params, n, 5), make_router("dynamo_kv", params, n, 5)
    assert fast.route.__self__ is fast._slots and fast.on_complete.__self__ is fast._slots
    for i, (hashes, prompt, event, back) in enumerate(steps):
        request = req(i, float(i), prompt, hashes)
        assert fast.route(request, views(n=n)) == DynamoKV.route(rule, request, views(n=n))
        j = i - back  # an earlier request (or this one) reports its first token, or ends, or both
        if j >= 0 and event:
            replica = rule._live[j][0] if j in rule._live else 0
            if event & 1:
                fast.on_first_token(j, replica, float(i))
                DynamoKV.on_first_token(rule, j, replica, float(i))
            if event & 2:
                fast.on_complete(j, replica, float(i))
                DynamoKV.on_complete(rule, j, replica, float(i))
        assert (fast.prefill_tokens, fast.active_blocks, fast._live) == (rule.prefill_tokens, rule.active_blocks,
                                                                         rule._live)
        assert [index.seen for index in fast.indexes] == [index.seen for index in rule.indexes]
    assert fast.rng.bit_generator.state == rule.rng.bit_generator.state


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(_hashes, st.integers(1, 400), st.lists(st.integers(0, 3), min_size=6,
                                                                                    max_size=6),
                                             st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=6, max_size=6)),
                                   min_size=1, max_size=30))
def test_llm_d_compiled_scorer_decides_as_the_rule_written(n, steps):
    """``LLMDWeighted``'s instance ``route`` (the compiled scorer's, ``LLMDScorer``) and its class method (the rule
    as written) make the same picks and draws and index the same blocks."""
    fast, rule = make_router("llm_d_weighted", {}, n, 5), make_router("llm_d_weighted", {}, n, 5)
    assert fast.route.__self__ is fast._scorer
    for i, (hashes, prompt, waiting, kv) in enumerate(steps):
        request = req(i, float(i), prompt, hashes)
        shown = views(waiting=waiting[:n], kv=kv[:n])
        assert fast.route(request, shown) == LLMDWeighted.route(rule, request, shown)
        assert [index.seen for index in fast.indexes] == [index.seen for index in rule.indexes]
    assert fast.rng.bit_generator.state == rule.rng.bit_generator.state


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 70), st.lists(st.none() | st.tuples(st.sampled_from([0.0, 0.5, 1.0, math.inf]) |
                                                            st.floats(0.0, 10.0), st.integers(0, 69)), max_size=200))
def test_the_due_heap_pops_what_heapq_pops(num, ops):
    """``route_all``'s heap (``DueHeap``: times and replicas in two lists) pops the pairs ``heapq`` pops from a
    list of ``(time, replica)`` tuples, in the same order, equal times included."""
    heap, reference = DueHeap(num), [(0.0, r) for r in range(num)]
    for op in ops:
        if op is None:
            if reference:
                at = heap.top()
                assert (at, heap.pop()) == heapq.heappop(reference)
        else:
            heap.push(*op)
            heapq.heappush(reference, op)
        assert len(heap) == len(reference)
    while reference:
        at = heap.top()
        assert (at, heap.pop()) == heapq.heappop(reference)


@pytest.mark.parametrize("params", [{}, {"prefill_load_scale": 2.0, "overlap_credit": 0.5, "ttl_s": 2.0}])
def test_dynamo_fleet_routes_the_same_compiled_or_with_the_scan(params):
    """20 replicas behind dynamo_kv, shared prefixes and ties at the start: the same request table whichever way
    the costs are computed, and with the rule as written throughout (the class's ``route`` with the scan, its hooks
    called through the router as any router's are, not the slot manager's natively by ``Followed.notify``)."""
    workload = make_workload([(0.004 * i, 64 + 16 * (i % 7), 20) for i in range(400)])
    workload.requests["hash_ids"] = [[i % 3, 10 + i % 3, 100 + i] for i in range(400)]
    kwargs = dict(replicas=20, hash_block_tokens=32, latency=LinearStepModel(0.01, 1e-4))
    config = EngineConfig(enable_prefix_caching=True)
    compiled = simulate_fleet(workload, config, MODEL, GPU, router=make_router("dynamo_kv", params, 20, 1), **kwargs)
    scan = make_router("dynamo_kv", params, 20, 1)
    scan._compiled = False
    scan.on_first_token = lambda *args: DynamoKV.on_first_token(scan, *args)
    scan.on_complete = lambda *args: DynamoKV.on_complete(scan, *args)
    scanned = simulate_fleet(workload, config, MODEL, GPU, router=scan, **kwargs)
    pd.testing.assert_frame_equal(compiled.requests, scanned.requests)
    assert compiled.requests["replica"].nunique() > 10 and (compiled.requests["prefix_hit_tokens"] > 0).any()


def test_session_affinity_keeps_sessions_and_balances_the_rest():
    router = make_router("session_affinity", {}, 4)
    homes = {s: router.route(req(i, float(i), session=s), views(n=4)) for i, s in enumerate(["a", "b", "c"] * 3)}
    again = [router.route(req(10 + i, 10.0 + i, session=s), views(n=4)) for i, s in enumerate(["a", "b", "c"])]
    assert again == [homes["a"], homes["b"], homes["c"]]
    counts = list(router._counts.counts)
    assert router.route(req(20, 20.0), views(n=4)) == counts.index(min(counts))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.sampled_from([None, "a", "b", "c", "d"])), max_size=60),
       st.sampled_from([1, 3, 8]), st.sampled_from([0.5, 2.0, 60.0]))
def test_session_affinity_counts_the_window_as_written(steps, n, window):
    """The window's counts kept from one queue of (time, replica) give the rule as written: each replica's own window
    pruned at each arrival, the lowest count (the first of equals) for a request without a session."""
    router = make_router("session_affinity", {"qps_window_s": window}, n)
    windows: list[deque] = [deque() for _ in range(n)]
    now = 0.0
    for i, (gap, session) in enumerate(steps):
        now += gap
        chosen = router.route(req(i, now, session=session), views(n=n))
        for w in windows:
            while w and w[0] <= now - window:
                w.popleft()
        if session is None:
            lens = [len(w) for w in windows]
            assert chosen == lens.index(min(lens))
        windows[chosen].append(now)
        assert router._counts.counts == [len(w) for w in windows]


def test_session_column_reaches_the_router_through_the_fleet():
    workload = make_workload([(0.01 * i, 50, 5) for i in range(30)])
    workload.requests["session_id"] = [f"s{i % 3}" for i in range(30)]
    res = simulate_fleet(workload, EngineConfig(), MODEL, GPU, replicas=4, router="session_affinity",
                         latency=LinearStepModel(0.01, 0.0))
    per_session = res.requests.groupby(workload.requests["session_id"])["replica"].nunique()
    assert (per_session == 1).all()


def test_a_prefix_sharing_request_follows_its_cache_in_the_fleet():
    """Two groups of requests with different shared prefixes, interleaved: the cache-aware router keeps each group
    on one replica (load stays far under its thresholds), and those requests hit the cache."""
    rows = [(0.05 * i, 96, 4) for i in range(12)]
    workload = make_workload(rows)
    workload.requests["hash_ids"] = [[i % 2 * 100, i % 2 * 100 + 1, 1000 + i] for i in range(12)]
    res = simulate_fleet(workload, EngineConfig(enable_prefix_caching=True), MODEL, GPU, replicas=3,
                         router="sglang_cache_aware", hash_block_tokens=32, latency=LinearStepModel(0.01, 0.0))
    groups = res.requests.groupby(pd.Series([i % 2 for i in range(12)]))["replica"].nunique()
    assert (groups == 1).all()
    assert (res.requests["prefix_hit_tokens"].iloc[2:] == 64).all()


def test_views_show_the_past_only():
    """What the router is shown at each arrival: outstanding counts only responses ended by then, and the engine's
    metrics are those of a step boundary no later than the arrival (minus the lag)."""
    workload = make_workload([(0.013 * i, 200, 30) for i in range(40)])
    fleet = FleetSimulation(workload, EngineConfig(), MODEL, GPU, replicas=3, router="least_outstanding",
                            latency=LinearStepModel(0.01, 1e-5))
    seen = []
    route = fleet.router.route

    def spy(request, replicas):
        seen.append((request, [(r.outstanding, r.routed) for r in replicas]))
        # A router that reads no engine metrics (least_outstanding) is shown none.
        assert all(r.num_waiting is None and r.kv_usage is None for r in replicas)
        return route(request, replicas)

    fleet.router.route = spy
    result = fleet.run()
    table = result.requests
    for request, counts in seen:
        t = request.arrival_s
        before = table.index < request.index
        for r, (outstanding, routed) in enumerate(counts):
            mine = table[before & (table["replica"] == r)]
            assert routed == len(mine)
            assert outstanding == int((~(mine["end_s"] <= t)).sum())


@pytest.mark.parametrize("router, lag", [("least_kv_usage", 0.0), ("least_kv_usage", 0.05), ("llm_d_weighted", 0.2)])
def test_metrics_are_a_published_boundary_at_least_lag_old(router, lag):
    """The KV usage and waiting count a router is shown are those an engine published at a step boundary no later
    than the arrival minus the lag (the latest such boundary).  Stepped one iteration at a time, every boundary is
    in the engine's history (a batched run's inner boundaries are computed: see the next test)."""
    workload = make_workload([(0.007 * i, 300, 40) for i in range(60)])
    fleet = FleetSimulation(workload, EngineConfig(), MODEL, GPU, replicas=2, router=router,
                            router_params={"metrics_lag_s": lag}, latency=LinearStepModel(0.01, 1e-5),
                            batch_decode_runs=False)
    shown = []
    route = fleet.router.route

    def spy(request, replicas):
        shown.append((request.arrival_s, [(r.num_waiting, r.kv_usage, len(fleet.replicas[r.index].history))
                                          for r in replicas]))
        return route(request, replicas)

    fleet.router.route = spy
    fleet.run()
    # This run is short enough that no replica dropped the entries it had read (``HISTORY_TRIM``): each history
    # is every boundary it published, in order.
    history = [[(p.t, p.waiting, p.running, p.used) for p in rep.history] for rep in fleet.replicas]
    assert all(h[0] == (0.0, 0, 0, 0) and len(h) < HISTORY_TRIM for h in history)
    blocks = fleet.replicas[0].scheduler.pool.num_blocks
    for t, per_replica in shown:
        for r, (waiting, kv, known) in enumerate(per_replica):
            # Published by then (in event order: a boundary at the arrival's instant may come after it).
            assert all(p[0] <= t for p in history[r][:known])  # nothing published ahead of the arrival
            past = [p for p in history[r][:known] if p[0] <= t - lag] or history[r][:1]
            assert (waiting, kv) == (past[-1][1], past[-1][3] / blocks)


@pytest.mark.parametrize("router", ["least_kv_usage", "llm_d_weighted"])
def test_the_published_waiting_count_is_what_the_last_schedule_left(router):
    """vLLM publishes its stats at the end of a step, before it adds the requests that arrived during it
    (v1/core/sched/scheduler.py make_stats, v1/engine/core.py _process_input_queue): at each boundary an engine
    publishes as waiting the requests its previous schedule() left waiting (arrived by then, scheduled later), not
    those that arrived during the step that just ended.  Stepped one iteration at a time, every boundary is in the
    history; max_num_seqs 2 keeps some requests waiting, and KV to spare keeps preemption out."""
    workload = make_workload([(0.0077 * i, 120 + 31 * (i % 5), 6 + 5 * (i % 4)) for i in range(80)])
    fleet = FleetSimulation(workload, EngineConfig(max_num_seqs=2), MODEL, GPU, replicas=2, router=router,
                            router_params={"metrics_lag_s": 0.0}, latency=LinearStepModel(0.01, 1e-5),
                            batch_decode_runs=False)
    table = fleet.run().requests
    assert (table["num_preemptions"] == 0).all()
    counted = 0
    for r, rep in enumerate(fleet.replicas):
        mine = table[table["replica"] == r]
        history = rep.history
        assert len(history) < HISTORY_TRIM  # every boundary kept
        for before, entry in zip(history, history[1:]):
            s = before.t  # the schedule() before this boundary
            left = int(((mine["arrival_s"] <= s) & (mine["first_scheduled_s"] > s)).sum())
            assert entry.waiting == left, (r, entry.t)
            counted += left
    assert counted > 0  # some boundaries did publish requests left waiting


@pytest.mark.parametrize("router, lag, batch", [("least_kv_usage", 0.0, True), ("least_kv_usage", 0.05, True),
                                                ("llm_d_weighted", 0.03, False)])
def test_kept_metric_views_are_those_made_again(router, lag, batch):
    """The fleet keeps a replica's metric view while nothing of it moved and the cutoff has not reached its next
    boundary (``MetricViews``): at every arrival each view the router is shown equals one made afresh from the
    replica."""
    workload = make_workload([(0.003 * i, 200 + 37 * (i % 5), 30 + i % 11) for i in range(300)])
    fleet = FleetSimulation(workload, EngineConfig(), MODEL, GPU, replicas=8, router=router,
                            router_params={"metrics_lag_s": lag}, latency=LinearStepModel(0.01, 1e-5),
                            batch_decode_runs=batch)
    route = fleet.router.route
    checked = []

    def spy(request, replicas):
        for rep in fleet.replicas:
            waiting, running, used, _, _ = rep.metrics_at(request.arrival_s - lag)
            assert replicas[rep.index] == ReplicaView(rep.index, rep.assigned, rep.assigned - rep.ended_pub, waiting,
                                                      running, used / rep.scheduler.pool.num_blocks)
        checked.append(request.index)
        return route(request, replicas)

    fleet.router.route = spy
    fleet.run()
    assert checked == list(range(300))


def _gapped_fleet(rows, replicas, router, lag, max_num_seqs):
    """A fleet behind ``router`` (lag ``lag``) of requests ``(gap to the last arrival, prompt, output)``."""
    t, data = 0.0, []
    for gap, prompt, output in rows:
        t += gap
        data.append((t, prompt, output))
    return FleetSimulation(make_workload(data), EngineConfig(max_num_seqs=max_num_seqs), MODEL, GPU,
                           replicas=replicas, router=router, router_params={"metrics_lag_s": lag},
                           latency=LinearStepModel(0.01, 1e-5))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.03), st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=50),
       st.integers(1, 6), st.sampled_from([0.0, 0.004, 0.05]), st.sampled_from([4, 64]))
def test_the_least_kv_usage_read_lazily_is_the_least_published(rows, replicas, lag, max_num_seqs):
    """``MetricViews.least_usage`` (a replica inside a run of decode steps, whose blocks in use only grow there,
    read again only where its last figure could be the least) finds the replicas at the least published KV usage,
    in index order, that reading every replica afresh finds: at each arrival of a fleet behind least_kv_usage."""
    fleet = _gapped_fleet(rows, replicas, "least_kv_usage", lag, max_num_seqs)
    route = fleet.router.route

    def spy(request, views):
        lazy = views.least_usage()
        fresh = [rep.metrics_at(request.arrival_s - lag)[2] / rep.scheduler.pool.num_blocks for rep in fleet.replicas]
        assert lazy == [r for r, usage in enumerate(fresh) if usage == min(fresh)]
        return route(request, views)

    fleet.router.route = spy
    fleet.run()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.03), st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=50),
       st.integers(1, 6), st.sampled_from([0.0, 0.004, 0.05]), st.sampled_from([4, 64]))
def test_the_llm_d_pick_read_lazily_is_the_pick_of_every_replica_read(rows, replicas, lag, max_num_seqs):
    """``llm_d_ties`` on the fleet's views (a replica inside a run of decode steps, whose KV usage is a lower bound
    there, read again only where its score could be the best) finds the replicas at the best score that every
    replica read afresh gives (a plain list of views: all exact), at each arrival of a fleet behind
    llm_d_weighted; max_num_seqs 4 queues arrivals inside runs (their waiting counts grow there)."""
    fleet = _gapped_fleet(rows, replicas, "llm_d_weighted", lag, max_num_seqs)
    router = fleet.router
    route = router.route

    def spy(request, views):
        weights = (router.prefix_weight, router.kv_weight, router.queue_weight)
        fresh = []
        for rep in fleet.replicas:
            waiting, running, used, _, _ = rep.metrics_at(request.arrival_s - lag)
            fresh.append(ReplicaView(rep.index, 0, 0, waiting, running, used / rep.scheduler.pool.num_blocks))
        assert llm_d_ties(views, None, 0, *weights) == llm_d_ties(ReplicaViews(fresh), None, 0, *weights)
        return route(request, views)

    router.route = spy
    fleet.run()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.03), st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=50),
       st.integers(1, 6), st.sampled_from([0.0, 0.004, 0.05]), st.sampled_from([4, 64]))
@example([(0.001, 300, 120)] * 30, 2, 0.004, 4)  # requests left waiting (its float too) and runs (bounds)
def test_the_metric_figures_are_the_published_ones_or_bounds(rows, replicas, lag, max_num_seqs):
    """At each arrival of a fleet behind llm_d_weighted, the figures ``MetricViews`` keeps per replica (unboxed,
    ``MetricFigures``; refreshed only where they may have changed, and skipping the pass over all replicas while
    the cutoff is below every one's next check) are those read afresh: the waiting count (and its float) exact,
    the KV usage exact where ``exact`` says so and else a lower bound; ``read`` makes a bound exact in the lists
    ``published_bounds`` returned."""
    fleet = _gapped_fleet(rows, replicas, "llm_d_weighted", lag, max_num_seqs)
    route = fleet.router.route

    def spy(request, views):
        fresh = [rep.metrics_at(request.arrival_s - lag) for rep in fleet.replicas]
        usage = [f[2] / rep.scheduler.pool.num_blocks for f, rep in zip(fresh, fleet.replicas)]
        figs = views.figures(True)
        assert [f.waiting for f in figs] == [f[0] for f in fresh]
        assert [f.fwaiting for f in figs] == [float(f[0]) for f in fresh]
        assert all(f.usage == u if f.exact else f.usage <= u for f, u in zip(figs, usage))
        waiting, bounds, exact = views.published_bounds()
        for r in range(len(figs)):
            if not exact[r]:
                views.read(r)
                assert (waiting[r], bounds[r], exact[r]) == (fresh[r][0], usage[r], True)
        return route(request, views)

    fleet.router.route = spy
    fleet.run()


def test_the_llm_d_scorer_routes_an_index_as_it_routes_its_view():
    """``LLMDScorer.route_at`` (request ``i`` from the lists a ``RequestViews`` makes its view of) picks, draws and
    indexes as the scorer's ``route`` on request ``i``'s view: shared prefixes of several lengths (the prefix term
    divides by the prompt's blocks), ties among the replicas."""
    n, count = 4, 60
    rng = np.random.default_rng(1)
    prompts = [int(p) for p in rng.integers(16, 200, count)]
    keys = [tuple(range(i % 3 * 1000, i % 3 * 1000 + p // 16)) for i, p in enumerate(prompts)]
    requests = RequestViews([0.01 * i for i in range(count)], ["a"] * count, prompts, keys, 16, None)
    fast, slow = make_router("llm_d_weighted", {}, n, 5), make_router("llm_d_weighted", {}, n, 5)
    for i in range(count):
        shown = views(waiting=[int(w) for w in rng.integers(0, 3, n)],
                      kv=[float(u) for u in rng.choice([0.0, 0.25, 0.5], n)])
        assert fast._scorer.route_at(requests, i, shown) == slow.route(requests.view(i), shown)
        assert [index.seen for index in fast.indexes] == [index.seen for index in slow.indexes]
    assert fast.rng.bit_generator.state == slow.rng.bit_generator.state


def test_the_fleet_calls_the_llm_d_scorer_without_views_and_picks_the_same():
    """``route_all`` calls the compiled scorer of an llm_d_weighted router (``LLMDScorer.route_at``: the request's
    fields from the lists its view is made of, no view made) and picks what the scorer's ``route`` picks on the
    request's view (a router whose ``route`` is another callable gets the view): the same request table, with
    shared prefixes (the prefix term) and ties."""
    rows = [(0.004 * i, 64 + 48 * (i % 7), 20 + i % 30) for i in range(240)]
    tables = []
    for wrapped in (False, True):
        workload = make_workload(rows)
        workload.requests["hash_ids"] = [[i % 3 * 100, i % 3 * 100 + 1, 1000 + i] for i in range(240)]
        fleet = FleetSimulation(workload, EngineConfig(enable_prefix_caching=True), MODEL, GPU, replicas=5,
                                router="llm_d_weighted", latency=LinearStepModel(0.01, 1e-5), hash_block_tokens=32)
        scorer = fleet.router._scorer
        if wrapped:
            fleet.router.route = lambda request, views: scorer.route(request, views)
        tables.append(fleet.run().requests)
    assert tables[0]["replica"].nunique() > 1 and (tables[0]["prefix_hit_tokens"] > 0).any()
    pd.testing.assert_frame_equal(tables[0], tables[1])


def test_a_waiting_count_grown_inside_a_run_is_read_where_it_grows():
    """A replica whose run of decode steps had arrivals queued during it (max_num_seqs 1: they join a blocked
    queue) publishes a waiting count that grows at the run's inner boundaries, so ``MetricViews`` reads it again
    there (not only its KV usage, as a lower bound): at each arrival of this fleet behind llm_d_weighted the
    views' waiting counts are those read afresh, and at the last arrival the grown count decides the pick
    (replica 1 alone is best; with replica 0's count from before the queued arrivals, both tie)."""
    data = [(0.0, 200, 60), (0.0, 200, 20), (0.0, 64, 60), (0.02, 200, 20), (0.03, 64, 20), (0.04, 16, 60),
            (0.05, 16, 20), (0.055, 200, 60), (0.06, 16, 60), (0.08, 200, 20)]
    lag = 0.004
    fleet = FleetSimulation(make_workload(data), EngineConfig(max_num_seqs=1), MODEL, GPU, replicas=2,
                            router="llm_d_weighted", router_params={"metrics_lag_s": lag},
                            latency=LinearStepModel(0.01, 1e-5))
    router = fleet.router
    route = router.route
    picks = []

    def spy(request, views):
        weights = (router.prefix_weight, router.kv_weight, router.queue_weight)
        fresh = [rep.metrics_at(request.arrival_s - lag) for rep in fleet.replicas]
        waiting, _, _ = views.published_bounds()
        assert waiting == [f[0] for f in fresh]
        picks.append(llm_d_ties(views, None, 0, *weights))
        return route(request, views)

    router.route = spy
    fleet.run()
    assert picks[-1] == [1]


class _BoundedViews(ReplicaViews):
    """Views whose KV usage is a lower bound where ``exact`` is false, made exact by :meth:`read` (as the fleet's
    ``MetricViews`` inside a run of decode steps); ``reads`` lists the replicas read."""

    def __init__(self, waiting, usage, bound):
        self.waiting, self.true, self.reads = list(waiting), list(usage), []
        self.usage = [min(b, u) for b, u in zip(bound, usage)]
        self.exact = [b >= u for b, u in zip(bound, usage)]

    def __len__(self):
        return len(self.waiting)

    def published_bounds(self):
        return self.waiting, self.usage, self.exact

    def read(self, r):
        self.reads.append(r)
        self.usage[r], self.exact[r] = self.true[r], True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 100), st.integers(0, 4)),
                min_size=1, max_size=8),
       st.integers(0, 4), st.sampled_from([(3.0, 2.0, 2.0), (0.0, 1.0, 0.0), (1.0, 0.0, 5.0), (0.5, 7.0, 1.0)]))
def test_llm_d_ties_on_bounds_reads_what_could_be_best(rows, blocks, weights):
    """``llm_d_ties`` given KV usage lower bounds (``published_bounds``) finds the ties that exact figures give, and
    reads a replica only where its bound's score was at or below a best found."""
    waiting = [w for w, _, _, _ in rows]
    usage = [u / 100 for _, u, _, _ in rows]
    bound = [b / 100 for _, _, b, _ in rows]
    matched = [m for _, _, _, m in rows] if blocks else None
    lazy = _BoundedViews(waiting, usage, bound)
    exact = llm_d_ties(ReplicaViews([ReplicaView(r, 0, 0, waiting[r], 0, usage[r]) for r in range(len(rows))]),
                       matched, blocks, *weights)
    assert llm_d_ties(lazy, matched, blocks, *weights) == exact
    assert all(r not in lazy.reads for r in exact if bound[r] >= usage[r])  # an exact one is never read
    assert len(set(lazy.reads)) == len(lazy.reads)


class _UserViews(ReplicaViews):
    """A user's views: a sequence of ``ReplicaView`` that implements only ``len`` and ``[r]`` (the reads are
    ``ReplicaViews``'s generic ones)."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, r):
        return self.items[r]


def test_replica_views_wraps_a_plain_sequence_and_keeps_views():
    plain = views(waiting=[3, 1, 2], kv=[0.5, 0.2, 0.2])
    wrapped = replica_views(plain)
    assert type(wrapped) is ReplicaViews and list(wrapped) == plain and len(wrapped) == 3 and wrapped[1] == plain[1]
    assert wrapped.least_usage() == [1, 2] and wrapped.published() == ([3, 1, 2], [0.5, 0.2, 0.2])
    assert replica_views(wrapped) is wrapped
    user = _UserViews(tuple(plain))
    assert replica_views(user) is user and user.least_usage() == [1, 2] and list(user) == plain


@pytest.mark.parametrize("router, lag, batch", [("least_kv_usage", 0.0, True), ("least_kv_usage", 0.05, True),
                                                ("llm_d_weighted", 0.03, True), ("llm_d_weighted", 0.0, False)])
def test_a_plain_list_of_views_gets_the_picks_the_fleets_views_get(router, lag, batch):
    """A router handed plain views (a list, a tuple, a user's ``ReplicaViews`` subclass: read view by view through
    ``ReplicaViews``'s generic reads, as a test, a user or ``kvtune replay`` hands them) picks, at every arrival of a
    fleet, what the same router handed the fleet's own views (``MetricViews``, read from its columns and lazily)
    picks: routers of one seed, one in the fleet and the others shown views made afresh from the replicas.  A small
    KV cache (200 blocks), so that a few blocks move a replica's usage enough to change a pick."""
    n = 6
    rows = [(0.01 * i, 96 + 37 * (i % 5), 60 + i % 100) for i in range(300)]
    workload = make_workload(rows)
    workload.requests["hash_ids"] = [[i % 4 * 100, i % 4 * 100 + 1, 1000 + i] for i in range(300)]
    params = {"metrics_lag_s": lag}
    config = EngineConfig(enable_prefix_caching=True, num_gpu_blocks_override=200, max_model_len=1024)
    fleet = FleetSimulation(workload, config, MODEL, GPU, replicas=n,
                            router=router, router_params=params, latency=LinearStepModel(0.01, 1e-5),
                            batch_decode_runs=batch, hash_block_tokens=32)
    wraps = [list, tuple, _UserViews, ReplicaViews]
    twins = [make_router(router, params, n) for _ in wraps]
    route = fleet.router.route
    picks = []

    def spy(request, given):
        assert type(given) is MetricViews
        picked = route(request, given)
        fresh = []
        for rep in fleet.replicas:
            waiting, running, used, _, _ = rep.metrics_at(request.arrival_s - lag)
            fresh.append(ReplicaView(rep.index, rep.assigned, rep.assigned - rep.ended_pub, waiting, running,
                                     used / rep.scheduler.pool.num_blocks))
        assert [twin.route(request, wrap(fresh)) for twin, wrap in zip(twins, wraps)] == [picked] * len(wraps)
        picks.append(picked)
        return picked

    fleet.router.route = spy
    fleet.run()
    assert len(picks) == 300 and len(set(picks)) == n
    assert all(twin.rng.bit_generator.state == fleet.router.rng.bit_generator.state for twin in twins)


def _shown(router, lag, batch, workload, config=None, replicas=3):
    fleet = FleetSimulation(workload, config or EngineConfig(), MODEL, GPU, replicas=replicas, router=router,
                            router_params={"metrics_lag_s": lag}, latency=LinearStepModel(0.01, 1e-5),
                            batch_decode_runs=batch)
    shown = []
    route = fleet.router.route

    def spy(request, views):
        shown.append((request.index, [(v.routed, v.outstanding, v.num_waiting, v.num_running, v.kv_usage)
                                      for v in views]))
        return route(request, views)

    fleet.router.route = spy
    return fleet, fleet.run(), shown


@pytest.mark.parametrize("config", [EngineConfig(), EngineConfig(flavor="vllm-v0"),
                                    EngineConfig(enable_prefix_caching=True, max_num_seqs=8)],
                         ids=["v1", "v0", "v1-prefix-queued"])
@pytest.mark.parametrize("router, lag", [("least_kv_usage", 0.0), ("llm_d_weighted", 0.0300037)])
def test_a_batched_run_shows_what_stepping_would_have_published(router, lag, config):
    """A replica's run of identical decode steps is neither cut at arrivals routed elsewhere nor visible to the
    router as one step: at each arrival the router is shown the queue lengths and KV usage that stepping one
    iteration at a time publishes (same views, same routes, same tables), and only an arrival routed to the
    replica ends its run (EngineLoop.cut).  The lag is off the 1e-5 s grid the arrivals and step times lie on:
    a run's step starts are computed a few ulps from the stepped sums, so a cutoff on a boundary could see it on
    either side."""
    workload = make_workload([(0.0173 * i, 200 + 37 * (i % 7), 20 + 13 * (i % 5)) for i in range(120)])
    stepped_fleet, stepped, by_step = _shown(router, lag, False, workload, config)
    batched_fleet, batched, by_run = _shown(router, lag, True, workload, config)
    assert by_run == by_step
    assert batched.requests["replica"].tolist() == stepped.requests["replica"].tolist()
    cols = ["request_id", "status", "generated_tokens", "first_token_s", "end_s"]
    pd.testing.assert_frame_equal(batched.requests[cols], stepped.requests[cols], rtol=1e-9)
    assert batched.num_iterations == stepped.num_iterations
    assert len(batched.steps) < len(stepped.steps)  # the batched fleet did batch runs



@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 1000.0), st.integers(1, 300), st.floats(1e-4, 0.05), st.sampled_from([0.0, 1e-6]) |
       st.floats(0.0, 1e-4), st.booleans(), st.lists(st.tuples(st.floats(0.0, 20.0), st.integers(0, 320)),
                                                     min_size=1, max_size=40))
def test_a_run_walked_on_finds_the_step_a_search_finds(start, steps, first, increment, affine, calls):
    """``RunRecord.seek`` at times that do not decrease (``EngineLoop.metrics_at``'s), the run shortened by cuts
    in between, finds the step ``last_boundary`` finds, and ``next_s`` is when the next step starts (inf after the
    run's last step): an affine run's steps (start + j * first + increment * j * (j - 1) / 2) and one of given
    durations."""
    durations = np.array([first + increment * j for j in range(steps)])
    record = RunRecord(start, steps, (first, increment) if affine else None, None if affine else durations,
                       0, 1, 0, [0] * 16, 1)
    at = start - first
    for gap, cut in calls:
        at += gap * first  # up to 20 steps on
        if 1 <= cut < record.num_steps:
            record.num_steps = cut  # an arrival routed there cut the run (EngineLoop.cut)
        j = record.seek(at)
        assert j == record.last_boundary(at)
        assert record.next_s == (record.boundary_s(j + 1) if j + 1 < record.num_steps else math.inf)

def test_the_load_index_keeps_the_least_and_most_loaded():
    """The routers' load index (kept on each change) against a scan, over random changes."""
    import random

    from sim.fleet._routers import _Loads

    rng = random.Random(0)
    counts = [0] * 7
    loads = _Loads(counts)
    for _ in range(3000):
        r = rng.randrange(7)
        counts[r] = max(0, counts[r] + rng.choice((-3, -1, 1, 1, 2)))
        loads.set(r, counts[r])
        assert (loads.lo, loads.hi) == (min(counts), max(counts))
        assert loads.first_least() == counts.index(min(counts))
        assert loads.at[loads.lo] == [i for i, c in enumerate(counts) if c == min(counts)]


@pytest.mark.parametrize("router, params", [("least_outstanding", {}), ("sglang_cache_aware", {}),
                                            ("sglang_cache_aware", {"balance_abs_threshold": 2,
                                                                    "balance_rel_threshold": 1.2})])
def test_a_router_told_of_each_load_change_decides_as_one_that_scans(router, params):
    """The fleet keeps the least-outstanding and cache-aware routers told of each load change (no scan of the
    replicas per arrival); the decisions, the tie draws included, are those of the scan."""
    rows = [(0.004 * i, 150 + 41 * (i % 9), 10 + 17 * (i % 6)) for i in range(300)]
    workload = make_workload(rows)
    workload.requests["hash_ids"] = [[i % 4, 10 + i % 8, 100 + i] for i in range(300)]
    config = EngineConfig(enable_prefix_caching=True, max_num_seqs=16)

    def run(follow):
        chosen = make_router(router, params, 5, seed=2)
        if not follow:
            chosen.follows_loads = False
        fleet = FleetSimulation(workload, config, MODEL, GPU, replicas=5, router=chosen, hash_block_tokens=64)
        assert (chosen._loads is not None) == follow
        return fleet.run().requests

    followed, scanned = run(True), run(False)
    assert followed["replica"].nunique() == 5
    pd.testing.assert_frame_equal(followed, scanned)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.booleans(), st.integers(1, 2**33)), max_size=60))
@example(0, [(False, 2**32), (False, 5)])  # numpy draws 2**32 as one 32-bit word: the half word buffer moves
def test_tie_draws_are_numpys(seed, steps):
    """A router's tie draw (``Router._draw``, numpy's bounded draw in Python) gives ``rng.integers(n)``'s numbers,
    and the generator's stream goes on the same when it is used directly between draws (``Router.rng``)."""
    import numpy as np

    router = make_router("least_outstanding", {}, 2, seed)
    reference = np.random.default_rng(seed)
    for direct, n in steps:
        if direct:  # someone else uses the router's generator: a 32-bit draw shares the buffered half word
            assert router.rng.integers(n, dtype=np.uint32 if n <= 2**32 else np.int64) == reference.integers(
                n, dtype=np.uint32 if n <= 2**32 else np.int64)
        else:
            assert router._draw(n) == reference.integers(n)
    assert router.rng.bit_generator.state == reference.bit_generator.state


def test_the_loops_views_are_the_named_tuples():
    """The compiled loop makes the views from all their fields at once (``tuple.__new__``): each equals the named
    tuple's own constructor's, of the same type."""
    requests = RequestViews([0.5, 1.5], ["a", "b"], [64, 80], [(), (7, 8)], 16, [None, "s"])
    for i in range(2):
        view = requests.view(i)
        assert type(view) is RequestView and view == RequestView(
            i, requests.arrivals[i], requests.classes[i], requests.prompts[i], requests.keys[i], 16,
            requests.sessions[i])
    workload = make_workload([(0.1 * i, 64, 4) for i in range(4)])
    fleet = FleetSimulation(workload, EngineConfig(), MODEL, GPU, replicas=2, router="least_kv_usage")
    rep = fleet.replicas[1]
    rep.assigned, rep.ended_pub = 5, 2
    given: list = [None, None]
    refresh_counts(fleet.replicas, given, [1], None)
    assert type(given[1]) is ReplicaView and given[1] == ReplicaView(1, 5, 3)
    rep.history = [Published(0.0, 4, 1, 30, None)]
    metrics = MetricViews(fleet.replicas)
    metrics.refresh(0.5, [1], [])
    assert type(metrics[1]) is ReplicaView and metrics[1] == ReplicaView(
        1, 5, 3, 4, 1, 30 / rep.scheduler.pool.num_blocks)
    router = make_router("round_robin", {}, 2)
    seen = []
    route = router.route
    router.route = lambda request, views: seen.append(list(views)) or route(request, views)
    assert preroute(router, requests, 2, None) == ([0, 1], [[0.5], [1.5]])
    assert seen[1] == [ReplicaView(0, 1), ReplicaView(1, 0)] and all(type(v) is ReplicaView for v in seen[1])


def test_views_made_when_read_are_the_views_kept():
    """A router that says it does not read its counts (``reads_counts`` false) is handed views made when read
    (``CountViews``): at each arrival the same views as the list the fleet keeps for the other routers, read by
    position, from the end or by iteration, and the same decisions."""
    workload = make_workload([(0.013 * i, 200, 30) for i in range(60)])
    kwargs = dict(replicas=3, latency=LinearStepModel(0.01, 1e-5))
    seen: dict[bool, list] = {True: [], False: []}
    tables = {}
    for reads in (True, False):
        router = make_router("least_outstanding", {}, 3, 0)
        router.follows_loads = False  # scans the views it is handed
        router.reads_counts = reads
        route = router.route

        def spy(request, replicas, route=route, reads=reads):
            assert type(replicas) is (list if reads else CountViews)
            shown = [tuple(v) for v in replicas]
            assert shown == [tuple(replicas[r]) for r in range(len(replicas))]
            assert tuple(replicas[-1]) == shown[-1] and type(replicas[0]) is ReplicaView
            seen[reads].append(shown)
            return route(request, replicas)

        router.route = spy
        tables[reads] = simulate_fleet(workload, EngineConfig(), MODEL, GPU, router=router, **kwargs).requests
    assert seen[True] == seen[False] and len(seen[True]) == 60
    assert any(v[2] for shown in seen[True] for v in shown)  # some requests outstanding
    pd.testing.assert_frame_equal(tables[True], tables[False])


def test_hooks_replaced_between_arrivals_are_the_ones_told():
    """``Followed.notify`` finds the slot manager's native hooks once per pair of hooks: hooks replaced during the
    run (the rule's, through the router) are the ones told from then on, and decide the same."""
    workload = make_workload([(0.004 * i, 64 + 16 * (i % 7), 20) for i in range(200)])
    kwargs = dict(replicas=8, latency=LinearStepModel(0.01, 1e-4))
    plain = simulate_fleet(workload, EngineConfig(), MODEL, GPU, router=make_router("dynamo_kv", {}, 8, 1), **kwargs)
    router = make_router("dynamo_kv", {}, 8, 1)
    route = router.route
    told = []

    def spy(request, replicas):
        if request.index == 100:
            router.on_first_token = lambda *args: told.append(args) or DynamoKV.on_first_token(router, *args)
        return route(request, replicas)

    router.route = spy
    swapped = simulate_fleet(workload, EngineConfig(), MODEL, GPU, router=router, **kwargs)
    assert told and min(args[0] for args in told) < 100
    pd.testing.assert_frame_equal(plain.requests, swapped.requests)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_followed_unsorted_slot_walk_matches_the_sorted_walk(data):
    """``Followed.notify`` walks each replica's watch unsorted when the hooks are the slot manager's (they commute:
    see the comment there): after every call the same slot state, the same told and the same watch as the sorted
    walk of hooks called through the router (the rule's path)."""
    from types import SimpleNamespace

    from sim.engine.request import Request, Status
    from sim.fleet._loop import DynamoSlots, Followed

    n = data.draw(st.integers(1, 3))
    count = data.draw(st.integers(1, 12))
    times = st.one_of(st.just(math.nan), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]))
    reqs, where = [], []
    for i in range(count):
        r = Request(i, i, "a", 0.0, data.draw(st.integers(1, 90)), 5, 4096)
        r.first_token_s = data.draw(times)
        r.end_s = data.draw(times)
        r.status = data.draw(st.sampled_from([Status.RUNNING, Status.FINISHED, Status.CANCELLED]))
        reqs.append(r)
        where.append(data.draw(st.integers(0, n - 1)))
    slot_sets = [DynamoSlots(n, 1.0, 1.0, 120.0, lambda k: 0) for _ in range(2)]
    for slots in slot_sets:
        for i, r in enumerate(reqs):
            slots.take(i, where[i], 0, r.prompt_tokens, 16, -(-r.prompt_tokens // 16), (), 0.0)
    fast_slots, rule_slots = slot_sets
    fast_router = SimpleNamespace(on_first_token=fast_slots.first_token, on_complete=fast_slots.complete)
    rule_router = SimpleNamespace(on_first_token=lambda *a: rule_slots.first_token(*a),
                                  on_complete=lambda *a: rule_slots.complete(*a))
    followed = [Followed([[] for _ in range(n)], count) for _ in range(2)]
    order = data.draw(st.permutations(list(range(count)) * 2))
    cut = sorted(data.draw(st.lists(st.integers(0, len(order)), min_size=3, max_size=3)))
    batches = [order[:cut[0]], order[cut[0]:cut[1]], order[cut[1]:cut[2]], order[cut[2]:]]
    for now, batch in zip([0.5, 1.0, 2.0, 3.5], batches):
        for f in followed:
            for i in batch:
                f.news[where[i]].append(reqs[i])
        followed[0].notify(fast_router, list(range(n)), now)
        followed[1].notify(rule_router, list(range(n)), now)
        assert followed[0].slots is fast_slots and followed[1].slots is None
        assert fast_slots.prefill_tokens == rule_slots.prefill_tokens
        assert fast_slots.active_blocks == rule_slots.active_blocks
        assert fast_slots.live == rule_slots.live
        assert followed[0].told == followed[1].told
        assert [sorted(req.index for req in w) for w in followed[0].watch] == \
            [sorted(req.index for req in w) for w in followed[1].watch]
        for f in followed:  # each request in its replica's watch once, flagged as watched, and no other flagged
            assert sorted(req.index for w in f.watch for req in w) == [i for i in range(count) if f.watching[i]]
