import numpy as np
import pytest

from sim.errors import ConfigError, TraceError
from sim.workload import WorkloadSpec, bundled_trace_path, load_trace

TRACE = str(bundled_trace_path())


def test_trace_spec_builds_window_scale_cap_and_head():
    spec = WorkloadSpec.from_dict({
        "trace": TRACE, "window": {"start_s": 600, "end_s": 1200}, "rate_scale": 2.0, "max_model_len": 2048,
        "classes": {"conv": {"slo": {"ttft_p99_s": 2.0}}},
    })
    w = spec.build()
    full = load_trace(TRACE).requests
    inside = full[(full["arrival_s"] >= 600) & (full["arrival_s"] < 1200)]
    assert len(w) + w.report.prompts_too_long_dropped == len(inside)
    assert w.requests["arrival_s"].max() < 300.0  # 600 s window at twice the rate
    assert ((w.requests["prompt_tokens"] + w.requests["output_tokens"]) <= 2048).all()
    assert w.report.outputs_capped > 0 and w.report.prompts_too_long_dropped > 0
    assert w.classes["conv"].slo.ttft_p99_s == 2.0
    assert len(WorkloadSpec.from_dict({"trace": "bundled", "max_requests": 10}).build()) == 10


def test_replaced_arrivals_keep_rows_and_are_seeded():
    spec = WorkloadSpec.from_dict({"trace": "bundled", "arrival": {"process": "gamma", "cv": 3.0},
                                   "window": {"end_s": 600}})
    a, b, c = spec.build(), spec.build(), spec.build(seed=5)
    assert a.requests.equals(b.requests)
    assert not a.requests["arrival_s"].equals(c.requests["arrival_s"])
    original = load_trace(TRACE).window(0, 600)
    assert a.requests["prompt_tokens"].tolist() == original.requests["prompt_tokens"].tolist()
    assert len(a) / a.span_s == pytest.approx(len(original) / original.span_s, rel=0.25)


def test_untimed_trace_gets_arrivals_before_window(data_dir):
    spec = WorkloadSpec.from_dict({"trace": "sharegpt_lengths_head.csv", "arrival": {"rate_rps": 10},
                                   "window": {"end_s": 1.5}}, base_dir=data_dir)
    w = spec.build()
    assert 0 < len(w) < 30 and w.requests["arrival_s"].max() < 1.5


def test_generator_spec_with_empirical_and_constant_lengths():
    spec = WorkloadSpec.from_dict({
        "generator": {"num_requests": 500, "classes": {
            "chat": {"rate_rps": 4, "cv": 2, "lengths": {"dist": "empirical", "trace": "bundled", "class": "conv"}},
            "probe": {"rate_rps": 1, "prompt_tokens": {"dist": "constant", "value": 128},
                      "output_tokens": {"dist": "lognormal", "mu": 3, "sigma": 0.5, "max": 64}},
        }},
        "classes": {"chat": {"priority": 0}, "probe": {"priority": 1}},
        "seed": 3,
    })
    w = spec.build()
    assert len(w) == 500 and set(w.classes) == {"chat", "probe"}
    probe = w.requests[w.requests["class"] == "probe"]
    assert (probe["prompt_tokens"] == 128).all() and probe["output_tokens"].max() <= 64
    assert len(probe) == pytest.approx(100, rel=0.3)
    chat = w.requests[w.requests["class"] == "chat"]
    real = set(zip(load_trace(TRACE).requests["prompt_tokens"], load_trace(TRACE).requests["output_tokens"]))
    assert set(zip(chat["prompt_tokens"], chat["output_tokens"])) <= real  # resampled pairs, kept together
    assert np.all(np.diff(w.requests["arrival_s"]) >= 0)
    assert WorkloadSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("d, field", [
    ({}, "workload.trace"),
    ({"trace": "x.csv", "generator": {"duration_s": 1, "classes": {}}}, "workload.generator.classes"),
    ({"trace": "x.csv", "tracefile": "y"}, "workload.tracefile"),
    ({"trace": "x.csv", "format": "csv"}, "workload.format"),
    ({"trace": "x.csv", "rate_scale": 0}, "workload.rate_scale"),
    ({"trace": "x.csv", "max_model_len": 1.5}, "workload.max_model_len"),
    ({"trace": "x.csv", "window": {"start_s": 5, "end_s": 2}}, "workload.window.end_s"),
    ({"trace": "x.csv", "failed_requests": "hide"}, "workload.failed_requests"),
    ({"trace": "x.csv", "skip_bad_rows": "yes"}, "workload.skip_bad_rows"),
    ({"trace": "x.csv", "seed": -1}, "workload.seed"),
    ({"generator": {"duration_s": 10, "classes": {"a": {"rate_rps": 1}}}}, "workload.generator.classes.a.prompt_tokens"),
    ({"generator": {"duration_s": 10, "num_requests": 5, "classes": {}}}, "workload.generator.duration_s"),
    ({"generator": {"duration_s": 10, "classes": {"a": {"rate_rps": 1, "cv": -1}}}}, "workload.generator.classes.a.cv"),
    ({"generator": {"duration_s": 10, "classes": {"a": {"rate_rps": 1, "prompt_tokens": {"dist": "zipf"}}}}},
     "workload.generator.classes.a.prompt_tokens.dist"),
    ({"generator": {"duration_s": 10, "classes": {"a": {"rate_rps": 1, "lengths": {"trace": "t", "kind": 1}}}}},
     "workload.generator.classes.a.lengths.kind"),
    ({"generator": {"duration_s": 10, "classes": {"a": {"rate_rps": 1, "lengths": {"trace": "t"}}}},
      "arrival": {"rate_rps": 3}}, "workload.arrival"),
])
def test_spec_errors_name_the_key(d, field):
    with pytest.raises(ConfigError) as err:
        WorkloadSpec.from_dict(d, "workload")
    assert err.value.field == field


def test_missing_trace_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        WorkloadSpec.from_dict({"trace": "missing.csv"}, base_dir=tmp_path).build()
