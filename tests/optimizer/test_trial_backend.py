"""Trial backends and samplers: replicate averaging, aborted engines as failed trials, seeded samplers."""

from __future__ import annotations

import io
import math

import optuna
import pytest
from optimizer_test_helpers import spec_dict

from optimizer import (
    InProcessExecutor,
    SimBackend,
    StudySpec,
    TrialError,
    Tuner,
    make_sampler,
    mean_metrics,
    open_study,
    prepare,
)
from sim.errors import ConfigError
from sim.workload._spec import WorkloadSpec

WORKLOAD = {"trace": "bundled", "max_requests": 200, "rate_scale": 4,
            "arrival": {"process": "poisson"}}  # regenerated arrivals: each seed is other traffic


def test_mean_metrics():
    out = mean_metrics([{"a": 1.0, "b": math.nan, "c": math.inf, "d": math.nan},
                        {"a": 3.0, "b": 4.0, "c": 1.0, "d": math.nan}])
    assert out["a"] == 2.0 and out["b"] == 4.0 and out["c"] == math.inf and math.isnan(out["d"])
    assert mean_metrics([{"x": 5}]) == {"x": 5.0}


def test_replicates_average_seeds():
    backend = SimBackend(WorkloadSpec.from_dict(WORKLOAD), "Llama-2-7B", "L40S")
    knobs = {"max_model_len": 4096, "kv_cache_dtype": "fp8"}
    one = [backend.run_one(knobs, seed)[0] for seed in (0, 1)]
    assert one[0]["output_tokens_per_s"] != one[1]["output_tokens_per_s"]  # different traffic per seed
    both = backend.run(knobs, [0, 1])
    assert both["output_tokens_per_s"] == pytest.approx((one[0]["output_tokens_per_s"] + one[1]["output_tokens_per_s"]) / 2)
    assert both["class.conv.e2e_s.p99"] == pytest.approx((one[0]["class.conv.e2e_s.p99"] + one[1]["class.conv.e2e_s.p99"]) / 2)


def test_study_with_replicates(tmp_path):
    d = spec_dict(replicates=2, budget={"trials": 2}, search={"base": "none", "max_num_seqs": [32, 128]})
    d["workload"] = {**WORKLOAD, "classes": {"conv": {"slo": {"e2e_p99_s": 40}}}}
    spec = StudySpec.from_dict(d)
    assert spec.replicate_seeds() == [0, 1]
    tuner = Tuner(spec, storage="memory", executor=InProcessExecutor(), progress=io.StringIO())
    tuner.run()
    backend = SimBackend(WorkloadSpec.from_dict(d["workload"]), spec.model, spec.gpu)
    for t in tuner.study.trials:
        expected = backend.run(t.user_attrs["knobs"], [0, 1])
        assert t.values[0] == pytest.approx(expected["output_tokens_per_s"])


def test_an_aborted_engine_fails_the_trial(tmp_path):
    # V0 swap preemption with almost no CPU swap space: vLLM aborts, and so does the simulated engine.
    knobs = {"flavor": "vllm-v0", "max_model_len": 2048, "preemption_mode": "swap", "swap_space_gb": 0.05,
             "num_gpu_blocks_override": 300}
    backend = SimBackend(WorkloadSpec.from_dict(WORKLOAD), "Llama-2-7B", "L40S")
    with pytest.raises(TrialError, match="engine aborted: swap preemption"):
        backend.run(knobs, [0])
    d = spec_dict(flavor="vllm-v0", vllm_version="0.8.5",
                  engine={"max_model_len": 2048, "preemption_mode": "swap", "num_gpu_blocks_override": 300},
                  search={"base": "none", "swap_space_gb": [0.05, 64]}, budget={"trials": 2})
    d["workload"] = {**WORKLOAD, "classes": {"conv": {"slo": {"e2e_p99_s": 40}}}}
    spec = StudySpec.from_dict(d)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(prepare(spec), storage)
    study.enqueue_trial({"swap_space_gb": 0.05})
    study.enqueue_trial({"swap_space_gb": 64})
    result = Tuner(spec, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()
    assert result.failed == 1 and result.complete == 1
    failed = next(t for t in optuna.load_study(study_name=spec.name, storage=storage).trials
                  if t.state == optuna.trial.TrialState.FAIL)
    assert failed.user_attrs["fail_reason"].startswith("TrialError: engine aborted: swap preemption")


@pytest.mark.parametrize(("name", "cls"), [("tpe", optuna.samplers.TPESampler), ("nsga2", optuna.samplers.NSGAIISampler),
                                           ("random", optuna.samplers.RandomSampler)])
def test_samplers(name, cls):
    spec = StudySpec.from_dict(spec_dict(sampler={"name": name, "seed": 7}))
    assert isinstance(make_sampler(spec.sampler, spec.search, constrained=True), cls)


def test_grid_and_gp_samplers():
    spec = StudySpec.from_dict(spec_dict(sampler={"name": "grid"}, search={"base": "none", "max_num_seqs": [8, 16]}))
    assert isinstance(make_sampler(spec.sampler, spec.search, constrained=True), optuna.samplers.GridSampler)
    gp = StudySpec.from_dict(spec_dict(sampler={"name": "gp"}))
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError) as info:
            make_sampler(gp.sampler, gp.search, constrained=True)
        assert info.value.field == "sampler.name" and "torch" in str(info.value)
    else:
        assert isinstance(make_sampler(gp.sampler, gp.search, constrained=True), optuna.samplers.GPSampler)
