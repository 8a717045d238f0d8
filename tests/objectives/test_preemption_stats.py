"""Preemptions per request: mean and distribution over every request, whatever its status."""

import math

import pytest

from objectives import preemption_stats, summarize
from sim.workload.classes import RequestClass


def test_distribution_by_hand(tables):
    counts = [0] * 6 + [1, 1, 2, 5, 7]
    reqs = tables.requests(*(tables.request(ttft=0.1, end=1, preemptions=n) for n in counts[:-1]),
                           tables.request("timed_out", end=30, generated=3, preemptions=7))
    p = preemption_stats(reqs)
    assert p.total == 16 and p.mean == pytest.approx(16 / 11)
    assert (p.p50, p.p90, p.p99, p.max) == (0, 5, 7, 7)  # sorted index ceil(q * 10): 5, 9, 10
    assert p.share_ge1 == pytest.approx(5 / 11) and p.share_ge2 == pytest.approx(3 / 11)


def test_unknown_counts_give_nan(tables):
    reqs = tables.requests(tables.request(ttft=0.1, end=1, preemptions=1), tables.request(ttft=0.1, end=1))
    reqs["num_preemptions"] = [1, math.nan]
    assert math.isnan(preemption_stats(reqs).mean)


def test_per_class_mean_in_summary(tables):
    classes = {"a": RequestClass("a"), "b": RequestClass("b")}
    reqs = tables.requests(tables.request(cls="a", ttft=0.1, end=1, preemptions=3),
                           tables.request(cls="a", ttft=0.1, end=1, preemptions=1),
                           tables.request(cls="b", ttft=0.1, end=1))
    s = summarize(reqs, None, classes)
    assert s.classes["a"].preemptions_mean == 2.0 and s.classes["b"].preemptions_mean == 0.0
    assert s.to_dict()["preemptions_per_request.share_ge1"] == pytest.approx(2 / 3)
