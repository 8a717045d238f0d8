"""Requests that did not finish enter the latency tails as censored values, never dropped."""

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objectives import latency_samples, summarize
from sim.errors import ConfigError
from sim.workload.classes import SLO, RequestClass

CHAT = {"chat": RequestClass("chat", SLO(e2e_p99_s=10.0), timeout_s=30.0)}
OPEN = {"open": RequestClass("open")}  # no timeout


def test_timed_out_request_is_censored_at_least_at_its_timeout(tables):
    rows = [tables.request(cls="chat", ttft=0.1, end=1.0 + i / 100) for i in range(99)]
    rows.append(tables.request("timed_out", cls="chat", end=25.0, generated=0))  # left early: still >= timeout
    s = latency_samples(tables.requests(*rows), CHAT)
    assert s["e2e_s"].iloc[-1] == 30.0 and s["ttft_s"].iloc[-1] == 30.0
    assert math.isnan(s["tpot_s"].iloc[-1]) and not s["tpot_applicable"].iloc[-1]  # lost: no TPOT
    assert s["e2e_censored"].iloc[-1] and s["ttft_censored"].iloc[-1] and not s["e2e_censored"].iloc[0]
    summary = summarize(tables.requests(*rows), None, CHAT)
    assert summary.classes["chat"].e2e_s.p99 == 30.0  # dropped, the p99 would be 1.98
    assert summary.classes["chat"].e2e_s.p50 == pytest.approx(1.5)


def test_cancelled_and_unfinished_count_the_time_they_waited(tables):
    rows = [
        tables.request("cancelled", cls="open", arrival=1.0, end=6.0, generated=0),
        tables.request("unfinished", cls="open", arrival=2.0, generated=0),  # no end: observed until 11.0
        tables.request(cls="open", arrival=0.0, ttft=1.0, end=11.0),
    ]
    s = latency_samples(tables.requests(*rows), OPEN)
    assert list(s["ttft_s"]) == [6.0, 9.0, 1.0]
    assert list(s["e2e_s"]) == [6.0, 9.0, 11.0]


def test_unfinished_request_waits_until_the_last_step_when_later(tables):
    reqs = tables.requests(tables.request("unfinished", cls="open", arrival=2.0, generated=0))
    s = latency_samples(reqs, OPEN, tables.steps(tables.step(start=19.0, duration=1.0)))
    assert s["e2e_s"].iloc[0] == 18.0


def test_rejected_is_inf_without_timeout_and_timeout_with_one(tables):
    rejected_open = tables.request("rejected", cls="open", end=0.0, generated=0)
    rejected_chat = tables.request("rejected", cls="chat", end=0.0, generated=0)
    s = latency_samples(tables.requests(rejected_open, rejected_chat), {**OPEN, **CHAT})
    assert s["e2e_s"].tolist() == [math.inf, 30.0]
    assert s["ttft_s"].tolist() == [math.inf, 30.0]


def test_observed_first_token_is_kept_for_a_request_that_timed_out(tables):
    reqs = tables.requests(tables.request("timed_out", cls="chat", ttft=2.0, end=30.0, generated=5))
    s = latency_samples(reqs, CHAT)
    assert s["ttft_s"].iloc[0] == 2.0  # produced: observed, not censored
    assert s["tpot_s"].iloc[0] == pytest.approx(28.0 / 4)  # mean per token it had reached when it left
    assert s["e2e_s"].iloc[0] == 30.0


def test_tpot_of_one_token_answers(tables):
    reqs = tables.requests(
        tables.request(cls="open", ttft=1.0, end=1.0, generated=1),  # finished: no TPOT
        tables.request("cancelled", cls="open", ttft=1.0, end=4.0, generated=1),  # lost before a 2nd token
        tables.request(cls="open", ttft=1.0, end=3.0, generated=3),
    )
    s = latency_samples(reqs, OPEN)
    assert not s["tpot_applicable"].iloc[0] and math.isnan(s["tpot_s"].iloc[0])
    assert not s["tpot_applicable"].iloc[1] and math.isnan(s["tpot_s"].iloc[1])
    summary = summarize(reqs, None, OPEN)
    assert summary.classes["open"].tpot_s.p50 == 1.0  # both 1-token requests excluded, not NaN
    assert summary.classes["open"].tpot_s.censored_share == pytest.approx(1 / 3)  # the lost one


def test_unknown_latency_of_a_finished_request_gives_nan_not_an_invented_value(tables):
    row = tables.request(cls="chat", ttft=1.0, end=2.0)
    row.update(ttft_s=math.nan, first_token_s=math.nan, e2e_s=math.nan)  # replay could not observe
    reqs = tables.requests(row, tables.request("timed_out", cls="chat", end=30.0, generated=0))
    summary = summarize(reqs, None, CHAT)
    assert math.isnan(summary.classes["chat"].ttft_s.p99)
    assert math.isnan(summary.classes["chat"].e2e_s.p50)


def test_request_of_undefined_class_is_a_config_error(tables):
    with pytest.raises(ConfigError, match="ghost"):
        latency_samples(tables.requests(tables.request(cls="ghost", ttft=1, end=2)), CHAT)


def test_unknown_status_is_a_config_error(tables):
    with pytest.raises(ConfigError, match="exploded"):
        latency_samples(tables.requests(tables.request("exploded", cls="chat", end=1)), CHAT)


latency = st.floats(0.01, 29.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(latency, latency), min_size=1, max_size=40), st.integers(1, 5), st.sampled_from(
    ["ttft_s", "e2e_s"]))
def test_adding_timed_out_requests_never_lowers_the_p99(tables, pairs, n_timed_out, metric):
    """In a consistent run of a class with a 30 s timeout every request is over by 30 s after arrival."""
    done = [tables.request(cls="chat", ttft=min(a, b), end=max(a, b) + 0.01) for a, b in pairs]
    late = [tables.request("timed_out", cls="chat", end=30.0, generated=0) for _ in range(n_timed_out)]
    before = summarize(tables.requests(*done), None, CHAT).classes["chat"]
    after = summarize(tables.requests(*done, *late), None, CHAT).classes["chat"]
    assert getattr(after, metric).p99 >= getattr(before, metric).p99
    assert getattr(after, metric).p99 == 30.0  # <= 100 requests: the p99 is the largest, the censored one
    assert after.counts.timed_out == n_timed_out and after.counts.total == len(pairs) + n_timed_out
    assert getattr(after, metric).censored_share == pytest.approx(n_timed_out / (len(pairs) + n_timed_out))
    assert after.tpot_s.p99 == before.tpot_s.p99  # a request lost before its second token has no TPOT


def test_latency_samples_keep_the_index_of_the_table(tables):
    reqs = tables.requests(tables.request(cls="open", ttft=1, end=2)).set_axis(pd.Index([42]))
    assert list(latency_samples(reqs, OPEN).index) == [42]
