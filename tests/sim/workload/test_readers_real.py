"""The real traces in the shared folder load and describe as their README says (skipped when absent)."""

import pytest

from sim.workload import bundled_trace_path, load_trace
from sim.workload._fit import describe


@pytest.mark.parametrize("name, rows, span, rate, prompt, output, cv", [
    ("azure_conv_2023.csv", 19366, 3502, 5.53, (1155, 1020, 4142), (211, 129, 601), 1.09),
    ("azure_code_2023.csv", 8819, 3436, 2.57, (2048, 1469, 7436), (27.9, 13, 251), 13.15),
])
def test_timed_traces_match_their_readme(shared_traces, name, rows, span, rate, prompt, output, cv):
    w = load_trace(shared_traces / name)
    row = describe(w).iloc[0]
    assert row["requests"] == rows and w.report.bad_rows_skipped == 0
    assert row["span_s"] == pytest.approx(span, abs=1)
    assert row["rate_rps"] == pytest.approx(rate, abs=0.01)
    assert row["interarrival_cv"] == pytest.approx(cv, abs=0.06)
    assert (row["prompt_mean"], row["prompt_p50"], row["prompt_p99"]) == pytest.approx(prompt, abs=1)
    assert (row["output_mean"], row["output_p50"], row["output_p99"]) == pytest.approx(output, abs=1)


def test_bundled_copy_equals_shared_conv(shared_traces):
    a = load_trace(bundled_trace_path()).requests
    b = load_trace(shared_traces / "azure_conv_2023.csv").requests
    assert a.drop(columns=[]).equals(b)


def test_sharegpt_lengths_describe(shared_traces):
    from sim.workload import ArrivalSpec

    w = load_trace(shared_traces / "sharegpt_lengths.csv", arrival=ArrivalSpec("poisson", rate_rps=1.0))
    row = describe(w).iloc[0]
    assert row["requests"] == 30731
    assert (row["prompt_mean"], row["prompt_p50"], row["prompt_p99"]) == pytest.approx((2340, 1730, 7434), abs=1)
    assert (row["output_mean"], row["output_p50"], row["output_p99"]) == pytest.approx((439, 415, 998), abs=1)
