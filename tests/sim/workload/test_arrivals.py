import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.workload import ArrivalSpec, Workload, arrival_times, interarrival_cv


@pytest.mark.parametrize("spec, cv", [(ArrivalSpec("poisson", 10.0), 1.0), (ArrivalSpec("gamma", 10.0, 3.0), 3.0),
                                      (ArrivalSpec("gamma", 10.0, 0.5), 0.5)])
def test_rate_and_cv(spec, cv):
    times = arrival_times(spec, np.random.default_rng(1), n=50_000)
    assert np.all(np.diff(times) >= 0)
    assert len(times) / times[-1] == pytest.approx(10.0, rel=0.05)
    assert interarrival_cv(times) == pytest.approx(cv, rel=0.05)


def test_duration_bound_and_seeded():
    spec = ArrivalSpec("gamma", 4.0, 2.0)
    a = arrival_times(spec, np.random.default_rng(7), duration_s=1000.0)
    b = arrival_times(spec, np.random.default_rng(7), duration_s=1000.0)
    assert np.array_equal(a, b) and a[-1] < 1000.0
    assert len(a) == pytest.approx(4000, rel=0.1)


def test_trace_rate_used_when_spec_leaves_it_open():
    times = arrival_times(ArrivalSpec("poisson"), np.random.default_rng(0), rate_rps=2.0, n=20_000)
    assert len(times) / times[-1] == pytest.approx(2.0, rel=0.05)
    with pytest.raises(ConfigError, match="arrival.rate_rps"):
        arrival_times(ArrivalSpec("poisson"), np.random.default_rng(0), n=5)
    with pytest.raises(ConfigError, match="replay"):
        arrival_times(ArrivalSpec("replay"), np.random.default_rng(0), n=5)


@pytest.mark.parametrize("d, field", [
    ({"process": "weibull"}, "arrival.process"),
    ({"process": "poisson", "cv": 2}, "arrival.cv"),
    ({"process": "gamma", "cv": 0}, "arrival.cv"),
    ({"rate_rps": -1}, "arrival.rate_rps"),
    ({"rate": 5}, "arrival.rate"),
])
def test_spec_errors_name_the_key(d, field):
    with pytest.raises(ConfigError) as err:
        ArrivalSpec.from_dict(d)
    assert err.value.field == field


def test_spec_round_trip():
    spec = ArrivalSpec("gamma", 3.0, 2.5)
    assert ArrivalSpec.from_dict(spec.to_dict()) == spec


def _workload(gaps: list[float], prompts: list[int]) -> Workload:
    arrivals = np.cumsum([0.0] + gaps)
    n = len(arrivals)
    df = pd.DataFrame({"request_id": np.arange(n), "class": ["default"] * n, "arrival_s": arrivals,
                       "prompt_tokens": (prompts * n)[:n], "output_tokens": [1] * n})
    return Workload(df)


workloads = st.builds(_workload, st.lists(st.floats(0, 100, allow_nan=False), min_size=0, max_size=40),
                      st.lists(st.integers(1, 10_000), min_size=1, max_size=5))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(workloads, st.floats(0.01, 100))
def test_rate_scaling_scales_span_and_keeps_requests(w, factor):
    scaled = w.scale_rate(factor)
    assert len(scaled) == len(w)
    assert scaled.span_s == pytest.approx(w.span_s / factor, rel=1e-9, abs=1e-12)
    assert scaled.requests["prompt_tokens"].tolist() == w.requests["prompt_tokens"].tolist()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(workloads, st.floats(0, 2000), st.floats(0.001, 2000))
def test_window_keeps_exactly_the_requests_inside(w, start, length):
    cut = w.window(start, start + length)
    arrivals = w.requests["arrival_s"].to_numpy()
    inside = (arrivals >= start) & (arrivals < start + length)
    assert len(cut) == int(inside.sum())
    assert cut.requests["request_id"].tolist() == w.requests["request_id"][inside].tolist()
    assert np.all(cut.requests["arrival_s"].to_numpy() >= 0)
    assert np.all(cut.requests["arrival_s"].to_numpy() <= length * (1 + 1e-12))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(workloads, workloads, st.floats(0, 100))
def test_concat_adds_counts_and_spans(a, b, gap):
    c = a.concat(b, gap)
    assert len(c) == len(a) + len(b)
    assert c.requests["request_id"].is_unique
    assert np.all(np.diff(c.requests["arrival_s"].to_numpy()) >= 0)
    if len(a) and len(b):
        assert c.span_s == pytest.approx(a.span_s + gap + b.span_s, rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["poisson", "gamma"]))
def test_same_seed_same_arrivals(seed, process):
    spec = ArrivalSpec(process, 5.0, 1.0 if process == "poisson" else 2.0)
    a = arrival_times(spec, np.random.default_rng(seed), n=100)
    b = arrival_times(spec, np.random.default_rng(seed), n=100)
    assert np.array_equal(a, b)


def test_concat_refuses_conflicting_class_definitions():
    from sim.workload import RequestClass

    a = _workload([1.0], [5])
    b = Workload(a.requests, {"default": RequestClass("default", priority=2)})
    with pytest.raises(ConfigError, match="classes.default"):
        a.concat(b)
    assert len(a.concat(a, gap_s=5.0)) == 4


@pytest.mark.parametrize("call, text", [
    (lambda w: w.scale_rate(0), "rate_scale: must be > 0, got 0"),
    (lambda w: w.scale_rate(float("nan")), "rate_scale: must be > 0, got nan"),
    (lambda w: w.window(-1.0), "window.start_s: must be >= 0, got -1.0"),
    (lambda w: w.window(5.0, 2.0), "window.end_s: must be > start_s (5.0), got 2.0"),
    (lambda w: w.concat(w, gap_s=-2), "gap_s: must be >= 0, got -2"),
    (lambda w: w.with_hash_block_tokens(0), "hash_block_tokens: must be a whole number of tokens per hash id in "
                                            "[1, 1e+08] (Mooncake's traces: 512; a multiple of the engine's "
                                            "block_size), got 0"),
])
def test_workload_method_arguments_give_the_one_form(call, text):
    """The methods' argument checks word their errors as sim.fields does (issue 33): field, expected, got."""
    with pytest.raises(ConfigError) as err:
        call(_workload([1.0], [5]))
    assert str(err.value) == text
