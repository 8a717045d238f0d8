"""Cohorts by class and prompt-length bucket: a regression of long requests shows in their bucket."""

import math

import pytest

from objectives import summarize
from objectives._cohorts import bucket_label, prompt_edges
from sim.errors import ConfigError
from sim.workload.classes import RequestClass

CLASSES = {"default": RequestClass("default", timeout_s=60.0)}


def test_default_buckets_and_bounds(tables):
    prompts = [0, 511, 512, 1023, 4096, 8191, 8192, 100_000]
    reqs = tables.requests(*(tables.request(prompt=p, ttft=0.1, end=1.0) for p in prompts))
    buckets = summarize(reqs, None, CLASSES).prompt_buckets
    assert list(buckets) == ["0-512", "512-1024", "1024-2048", "2048-4096", "4096-8192", "8192-inf"]
    assert [b.counts.total for b in buckets.values()] == [2, 2, 0, 0, 2, 2]  # [low, high)
    assert math.isnan(buckets["1024-2048"].e2e_s.p99)  # empty bucket is kept, with no latency


def test_long_request_regression_is_visible_in_its_bucket(tables):
    short = [tables.request(prompt=200, ttft=0.1, end=1.0) for _ in range(200)]
    long_ok = [tables.request(prompt=6000, ttft=0.5, end=2.0) for _ in range(2)]
    long_bad = [tables.request(prompt=6000, ttft=0.5, end=2.0), tables.request("timed_out", prompt=6000, end=60.0,
                                                                               generated=0)]
    good = summarize(tables.requests(*short, *long_ok), None, CLASSES)
    bad = summarize(tables.requests(*short, *long_bad), None, CLASSES)
    assert bad.classes["default"].e2e_s.p99 == good.classes["default"].e2e_s.p99 == 1.0  # class p99 blind
    assert good.prompt_buckets["4096-8192"].e2e_s.p99 == 2.0
    assert bad.prompt_buckets["4096-8192"].e2e_s.p99 == 60.0
    assert bad.prompt_buckets["4096-8192"].counts.timed_out == 1


def test_custom_edges_are_completed_to_cover_every_prompt(tables):
    assert prompt_edges([1000]) == (0.0, 1000.0, math.inf)
    assert bucket_label(0.0, 1000.0) == "0-1000" and bucket_label(8192, math.inf) == "8192-inf"
    reqs = tables.requests(tables.request(prompt=10, ttft=0.1, end=1), tables.request(prompt=5000, ttft=0.1, end=1))
    s = summarize(reqs, None, CLASSES, prompt_bucket_edges=[1000])
    assert {k: v.counts.total for k, v in s.prompt_buckets.items()} == {"0-1000": 1, "1000-inf": 1}


@pytest.mark.parametrize("edges", [[], [0, 512, 512], [512, 0], [-1, 10], [0, float("nan")]])
def test_bad_edges_are_config_errors(edges):
    with pytest.raises(ConfigError, match="prompt_buckets"):
        prompt_edges(edges)


def test_status_counts_per_class(tables):
    classes = {"a": RequestClass("a"), "b": RequestClass("b"), "idle": RequestClass("idle")}
    r = tables.request
    reqs = tables.requests(r(cls="a", ttft=0.1, end=1), r("cancelled", cls="a", end=2, generated=0),
                           r("rejected", cls="b", end=0, generated=0), r("unfinished", cls="b", generated=0))
    s = summarize(reqs, None, classes)
    a, b, idle = (s.classes[k].counts for k in ("a", "b", "idle"))
    assert (a.finished, a.cancelled, a.total) == (1, 1, 2)
    assert (b.rejected, b.unfinished, b.total) == (1, 1, 2)
    assert idle.total == 0 and s.overall.counts.total == 4
