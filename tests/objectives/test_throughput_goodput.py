"""Output tokens per second and goodput, over the makespan (first arrival to last end)."""

import math

import pytest

from objectives import goodput_rps, makespan_s, output_tokens_per_s, summarize
from sim.workload.classes import SLO, RequestClass

CLASSES = {
    "chat": RequestClass("chat", SLO(ttft_p99_s=1.0, tpot_p99_s=0.1, e2e_p99_s=5.0), timeout_s=20.0),
    "batch": RequestClass("batch"),
}


@pytest.fixture
def run(tables):
    r = tables.request
    return tables.requests(
        r(cls="chat", arrival=0.0, ttft=0.5, end=1.3, generated=10),  # tpot 0.09: meets all
        r(cls="chat", arrival=1.0, ttft=1.5, end=2.4, generated=10),  # ttft 1.5 > 1.0
        r(cls="chat", arrival=2.0, ttft=0.2, end=2.0, generated=10),  # tpot 0.2 > 0.1
        r(cls="chat", arrival=3.0, ttft=0.3, end=0.3, generated=1),  # 1 token: no TPOT, meets the rest
        r("timed_out", cls="chat", arrival=4.0, ttft=0.5, end=20.0, generated=50),  # tokens not counted
        r(cls="batch", arrival=5.0, ttft=3.0, end=15.0, generated=100),  # no SLO: finished is enough
    )


def test_makespan_is_first_arrival_to_last_end(run):
    assert makespan_s(run) == 24.0  # timed-out request ends at 4 + 20


def test_output_tokens_per_s_counts_finished_requests_only(run):
    assert output_tokens_per_s(run) == pytest.approx((10 + 10 + 10 + 1 + 100) / 24.0)


def test_goodput_counts_requests_within_all_their_slos(run):
    assert goodput_rps(run, CLASSES) == pytest.approx(3 / 24.0)  # rows 0, 3 and the batch request
    summary = summarize(run, None, CLASSES)
    assert summary.goodput_rps == pytest.approx(3 / 24.0)
    assert summary.classes["chat"].slo_attainment == pytest.approx(2 / 5)
    assert summary.classes["batch"].goodput_rps == pytest.approx(1 / 24.0)


def test_no_ended_request_gives_nan_rates(tables):
    reqs = tables.requests(tables.request("unfinished", cls="batch", generated=0))
    assert math.isnan(makespan_s(reqs)) and math.isnan(output_tokens_per_s(reqs))


def test_unknown_generated_tokens_give_nan_throughput(tables, run):
    run.loc[0, "generated_tokens"] = math.nan
    assert math.isnan(output_tokens_per_s(run))


def test_unknown_latency_makes_goodput_unknown_unless_already_failed(tables, run):
    run.loc[0, "ttft_s"] = math.nan
    run.loc[0, "first_token_s"] = math.nan
    assert math.isnan(goodput_rps(run, CLASSES))  # row 0 could have met its SLO or not
    run.loc[0, "e2e_s"] = 99.0  # now it surely missed the e2e target
    assert goodput_rps(run, CLASSES) == pytest.approx(2 / 24.0)
