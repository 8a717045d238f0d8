import numpy as np
import pytest

from sim.workload import (GeneratorSpec, Lognormal, bundled_trace_path, describe, fit_lognormal, fit_workload,
                          generate, load_trace)


@pytest.fixture(scope="module")
def conv():
    return load_trace(bundled_trace_path())


def test_fit_then_generate_reproduces_rate_and_length_quantiles(conv):
    spec = fit_workload(conv)
    assert [c.name for c in spec.classes] == ["conv"]
    gen = generate(spec, seed=0)
    want = describe(conv).iloc[0]
    got = describe(gen).iloc[0]
    assert got["rate_rps"] == pytest.approx(want["rate_rps"], rel=0.05)
    for column in ("prompt_p50", "prompt_p99", "output_p50", "output_p99"):
        assert got[column] == pytest.approx(want[column], rel=0.10), column
    assert got["interarrival_cv"] == pytest.approx(want["interarrival_cv"], rel=0.10)


def test_fit_is_per_class_and_yaml_round_trips(conv, shared_traces):
    code = load_trace(shared_traces / "azure_code_2023.csv")
    both = conv.concat(code)
    spec = fit_workload(both)
    rates = {c.name: c.rate_rps for c in spec.classes}
    span = both.span_s
    assert rates["conv"] == pytest.approx(19366 / span) and rates["code"] == pytest.approx(8819 / span)
    cvs = {c.name: c.cv for c in spec.classes}
    assert cvs["code"] > 5 > cvs["conv"]
    assert GeneratorSpec.from_dict(spec.to_dict()).to_dict() == spec.to_dict()


def test_generate_is_seeded(conv):
    spec = fit_workload(conv.head(2000))
    a, b, c = generate(spec, seed=1), generate(spec, seed=1), generate(spec, seed=2)
    assert a.requests.equals(b.requests)
    assert not a.requests["arrival_s"].equals(c.requests["arrival_s"])


def test_fit_lognormal_pins_median_and_p99():
    rng = np.random.default_rng(0)
    values = np.rint(rng.gamma(2.0, 300.0, 50_000)) + 1
    fit = fit_lognormal(values)
    sample = fit.sample(200_000, np.random.default_rng(1))
    for q in (50, 99):
        assert np.percentile(sample, q) == pytest.approx(np.percentile(values, q), rel=0.03)
    assert sample.min() >= values.min() and sample.max() <= values.max()


def test_lognormal_clips_and_is_integer():
    d = Lognormal(mu=5.0, sigma=2.0, min=10, max=100)
    s = d.sample(1000, np.random.default_rng(0))
    assert s.dtype == np.int64 and s.min() == 10 and s.max() == 100


def test_describe_columns(conv):
    table = describe(conv.head(100))
    assert list(table.columns[:5]) == ["class", "requests", "span_s", "rate_rps", "interarrival_cv"]
    assert {"prompt_p50", "prompt_p90", "prompt_p99", "output_p50", "output_p90", "output_p99"} <= set(table.columns)
