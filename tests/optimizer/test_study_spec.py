"""Study spec validation: every error is a ConfigError whose field names the offending key."""

from __future__ import annotations

import pytest
from optimizer_test_helpers import spec_dict, write_spec

from optimizer import StudySpec, load_study_spec
from sim.errors import ConfigError


def _error(d, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict(d, **kwargs)
    return info.value


def test_base_spec_is_valid():
    spec = StudySpec.from_dict(spec_dict())
    assert spec.name == "conv-l40s"
    assert spec.flavor == "vllm-v1"
    assert spec.objectives == ("output_tokens_per_s", "p99_e2e_s:conv")
    assert spec.engine == {"max_model_len": 4096}
    assert spec.budget.trials == 20 and spec.budget.workers is None
    assert "max_num_seqs" in spec.search.names


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"trails": 5}, "trails", "unknown key"),
        ({"budget": {"trials": 0}}, "budget.trials", ">= 1"),
        ({"budget": {"trials": 5, "timeout": 3}}, "budget.timeout", "unknown key"),
        ({"budget": {"trial_timeout_s": -1}}, "budget.trial_timeout_s", "positive"),
        ({"sampler": {"name": "cmaes"}}, "sampler.name", "must be one of"),
        ({"sampler": {"name": "random", "population_size": 10}}, "sampler.population_size", "nsga2"),
        ({"flavor": "vllm-v2"}, "flavor", "must be one of"),
        ({"model": "Llama-9-1T"}, "model", "unknown model"),
        ({"gpu": "TPUv9"}, "gpu", "unknown GPU"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size", "must be one of"),
        ({"replicates": 0}, "replicates", ">= 1"),
        ({"objectives": ["throughput"]}, "objectives[0]", "unknown objective"),
        ({"objectives": []}, "objectives", "non-empty"),
        ({"constraints": "maybe"}, "constraints", "'slo', 'none'"),
        ({"constraints": ["p99_itl_s <= fast"]}, "constraints[0]", "not a number"),
        ({"constraints": ["conv", "throughput >= 3"]}, "constraints[1]", "unknown objective"),
        ({"vllm_version": 0.18}, "vllm_version", "string"),
        ({"vllm_version": "0.5.0"}, "vllm_version", "from 0.8.5"),
        ({"vllm_version": "banana"}, "vllm_version", "cannot read"),
        ({"engine": {"max_num_seq": 64}}, "engine.max_num_seq", "did you mean 'max_num_seqs'"),
        ({"engine": {"max_num_seqs": 0}}, "engine.max_num_seqs", "[1, 4096]"),
        ({"engine": {"gpu_memory_utilization": 1.5}}, "engine.gpu_memory_utilization", "(0.05, 1.0)"[1:5]),
        ({"engine": {"max_model_len": 999999}}, "engine.max_model_len", "exceeds the model's maximum"),
        ({"engine": {"flavor": "vllm-v0"}}, "engine.flavor", "top level"),
        ({"engine": {"max_num_batched_tokens": 128, "max_model_len": 4096}}, "engine.max_num_batched_tokens",
         "smaller than max_num_seqs 256"),
        # Knobs the chosen flavor does not have.
        ({"engine": {"swap_space_gb": 8}}, "engine.swap_space_gb", "not a knob of vllm-v1"),
        ({"engine": {"preemption_mode": "swap"}}, "engine.preemption_mode", "not a knob of vllm-v1"),
        # Knobs the target vLLM does not have.
        ({"engine": {"watermark": 0.05}}, "engine.watermark", "has no --watermark"),
        ({"search": {"watermark": {"low": 0.0, "high": 0.1}}}, "search.watermark", "has no --watermark"),
        # Search space entries.
        ({"search": {"max_num_seqs": {"low": 0, "high": 64}}}, "search.max_num_seqs.low", "[1, 4096]"),
        ({"search": {"max_num_seqs": {"low": 64, "high": 16}}}, "search.max_num_seqs.high", "must be > low"),
        ({"search": {"max_num_seqs": {"low": 8, "hihg": 64}}}, "search.max_num_seqs.hihg", "unknown key"),
        ({"search": {"max_num_seqs": {"low": 8}}}, "search.max_num_seqs.high", "required"),
        ({"search": {"kv_cache_dtype": ["auto", "fp4"]}}, "search.kv_cache_dtype.choices[1]", "must be one of"),
        ({"search": {"block_size": {"choices": [16, 24]}}}, "search.block_size.choices[1]", "8, 16, 32"),
        ({"search": {"reserved_kv_fraction": {"low": 0, "high": 0.5, "log": True}}},
         "search.reserved_kv_fraction.low", "log-scale"),
        ({"search": {"preemption_mode": ["recompute", "swap"]}}, "search.preemption_mode.choices", "offload"),
        ({"search": {"max_num_seqs": {"low": 8, "high": 64, "when": {"kv_cache_dtype": "fp16"}}}},
         "search.max_num_seqs.when.kv_cache_dtype", "not among"),
        ({"search": {"base": "none", "max_num_seqs": {"low": 8, "high": 64, "when": {"admission_policy": "predicted"}}}},
         "search.max_num_seqs.when", "not searched"),
        ({"engine": {"max_model_len": 4096, "max_num_seqs": 64}, "search": {"max_num_seqs": {"low": 8, "high": 64}}},
         "search.max_num_seqs", "also fixed"),
        ({"search": {"max_num_seqs": "lots"}}, "search.max_num_seqs", "list of choices"),
        ({"sampler": "grid"}, "sampler.name", "without conditions"),
        # The workload section is the workload engineer's WorkloadSpec, embedded: its errors keep their key.
        ({"workload": {"trace": "bundled", "max_requests": 0}}, "workload.max_requests", ">= 1"),
        ({"workload": {"trace": "bundled", "rate": 2}}, "workload.rate", "unknown key"),
    ],
)
def test_errors_name_the_key(changes, field, words):
    exc = _error(spec_dict(**changes))
    assert exc.field == field, str(exc)
    assert words in str(exc)


def test_v0_knobs_need_a_v0_target():
    # The V0 engine (and with it --preemption-mode) is gone from 0.11 on.
    exc = _error(spec_dict(flavor="vllm-v0", vllm_version=">=0.18"))
    assert exc.field == "vllm_version" and "no V0 engine" in str(exc)
    spec = StudySpec.from_dict(spec_dict(flavor="vllm-v0", vllm_version="0.8.5",
                                         engine={"max_model_len": 4096, "swap_space_gb": 8}))
    assert spec.flavor == "vllm-v0" and spec.engine["swap_space_gb"] == 8.0
    # 0.10.2 still ships V0, but a flag only bounded releases vouch for (kv offload) is refused on it.
    exc = _error(spec_dict(vllm_version="0.10.2", engine={"max_model_len": 4096, "kv_offloading_size_gb": 8}))
    assert exc.field == "engine.kv_offloading_size_gb" and "--kv-offloading-size" in str(exc)
    exc = _error(spec_dict(flavor="vllm-v0", vllm_version="0.8.5", engine={"watermark": 0.01}))
    assert exc.field == "engine.watermark" and "not a knob of vllm-v0" in str(exc)


def test_v0_engine_resolution_errors_name_the_engine_key():
    # V0 without chunked prefill needs max_num_batched_tokens >= max_model_len (vLLM refuses otherwise).
    exc = _error(spec_dict(flavor="vllm-v0", vllm_version="0.8.5",
                           engine={"max_model_len": 4096, "max_num_batched_tokens": 1024}))
    assert exc.field == "engine.max_num_batched_tokens"


def test_load_from_file_names_key_and_file(tmp_path):
    path = write_spec(tmp_path, spec_dict(budget={"trials": -3}), "mine.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert info.value.field == "budget.trials"
    assert "mine.yaml" in str(info.value)
    # The file stem is the default name; relative trace paths resolve against the spec's folder.
    d = spec_dict(name=None)
    spec = load_study_spec(write_spec(tmp_path, d, "my-study.yaml"))
    assert spec.name == "my-study"
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_study_spec(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_study_spec(tmp_path / "missing.yaml")


def test_a_file_error_names_the_file_at_fault_once(tmp_path):
    """The one form (sim.fields): field path, expected, got, file; a device YAML the spec points at is the file named."""
    path = write_spec(tmp_path, spec_dict(budget={"trials": 0}), "mine.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert str(info.value) == f"budget.trials: must be >= 1, got 0 (in {path})"
    device = tmp_path / "dev.yaml"
    device.write_text("mem_gb: 48\nhbm_bw_gbps: fast\nbf16_tflops: 180\nhost_link_gbps: 25\n")
    path = write_spec(tmp_path, spec_dict(gpu=str(device)), "dev-study.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert str(info.value) == f"hbm_bw_gbps: must be a number, got 'fast' (in {device.resolve()})"


def test_a_bad_latency_profile_is_the_file_named(tmp_path):
    """A latency profile the spec names is read like a device YAML: its own error names it, once (issue 33: it
    was '... (in p.yaml) (in spec.yaml)').  A profile that cannot be read is the spec's latency_profile at fault."""
    profile = tmp_path / "p.yaml"
    profile.write_text("coefficients:\n  mfu: fast\n")
    path = write_spec(tmp_path, spec_dict(latency_profile="p.yaml"), "prof-study.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert str(info.value) == f"coefficients.mfu: must be a number, got 'fast' (in {profile.resolve()})"
    assert info.value.field == "coefficients.mfu" and str(info.value).count("(in ") == 1
    path = write_spec(tmp_path, spec_dict(latency_profile="gone.yaml"), "gone-study.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert info.value.field == "latency_profile" and str(info.value).count("(in ") == 1
    assert str(info.value).startswith(f"latency_profile: {tmp_path.resolve() / 'gone.yaml'}: cannot read: ")
    assert str(info.value).endswith(f" (in {path})")


def test_a_latency_profile_that_is_not_yaml_is_the_file_named_once(tmp_path):
    """A profile the spec names that is not valid YAML is sim.safe_yaml's whole-file error, '<p.yaml>:<line>: not
    valid YAML: ...' (sim.fields.file_error): the profile named once, no '(in spec.yaml)' (issue 33)."""
    profile = tmp_path / "p.yaml"
    profile.write_text("kind: kvtune-latency-profile\ncoefficients: mfu: 0.3\n")
    path = write_spec(tmp_path, spec_dict(latency_profile="p.yaml"), "bad-prof-study.yaml")
    with pytest.raises(ConfigError) as info:
        load_study_spec(path)
    assert str(info.value) == f"{profile.resolve()}:2: not valid YAML: mapping values are not allowed here"
    assert getattr(info.value, "file", None) == str(profile.resolve())


def test_identity_ignores_budget_but_not_the_space():
    a = StudySpec.from_dict(spec_dict())
    b = StudySpec.from_dict(spec_dict(budget={"trials": 99, "workers": 4}, sampler={"name": "random", "seed": 3}))
    c = StudySpec.from_dict(spec_dict(search={"max_num_seqs": {"low": 8, "high": 64}}))
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != c.fingerprint()


def test_storage_defaults_to_sqlite_in_out_dir(tmp_path):
    spec = StudySpec.from_dict(spec_dict())
    assert spec.storage_url(out=tmp_path) == f"sqlite:///{(tmp_path / 'study.db').resolve()}"
    assert spec.storage_url("postgresql://db/x") == "postgresql://db/x"
    assert spec.out_dir() == spec.out_dir(None) and str(spec.out_dir()).endswith("conv-l40s")


def test_study_whose_model_never_fits_is_refused():
    # 70B bf16 weights (141 GB) cannot fit one L40S even at the most generous utilisation the search allows.
    # The field to change is the tensor parallelism (TP 4 holds them), and the line names model, gpu and TP.
    error = _error(spec_dict(model="Llama-3-70B", gpu="L40S"))
    assert error.field == "tensor_parallel_size" and "L40S" in str(error) and "weights" in str(error)
    assert "(model, gpu, tensor_parallel_size)" in str(error) and "TP 4 on L40S would hold them" in str(error)
    # On two H100s (TP 2) it fits, so the same spec is accepted.
    StudySpec.from_dict(spec_dict(model="Llama-3-70B", gpu="H100-SXM", tensor_parallel_size=2))


def test_study_latency_profile(tmp_path):
    import yaml

    from sim.latency import LatencyCoefficients

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"coefficients": {"mfu": 0.3}}))
    plain = StudySpec.from_dict(spec_dict())
    with_profile = StudySpec.from_dict(spec_dict(latency_profile=str(path)))
    assert plain.coefficients() is None
    assert with_profile.coefficients() == LatencyCoefficients(mfu=0.3)
    # A profile changes what trials measure; without one the identity is what it was before the key existed.
    assert with_profile.fingerprint() != plain.fingerprint()
    assert "latency_profile" not in plain.identity()
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict(spec_dict(latency_profile=str(tmp_path / "missing.yaml")))
    assert info.value.field == "latency_profile"


def test_bounds_in_constraints_become_constraints():
    from optimizer._study import prepare

    spec = StudySpec.from_dict(spec_dict(constraints=["slo", "slo_attainment:conv >= 0.9", "p99_itl_s <= 0.5"]))
    names = [c.name for c in prepare(spec).constraints]
    assert names == ["slo:conv:p99_e2e_s<=40", "slo_attainment:conv>=0.9", "p99_itl_s<=0.5"]
    only = StudySpec.from_dict(spec_dict(constraints=["preempted_ge2_share <= 0.01"]))
    assert [c.name for c in prepare(only).constraints] == ["preempted_ge2_share<=0.01"]
    with pytest.raises(ConfigError, match="ghost"):
        prepare(StudySpec.from_dict(spec_dict(constraints=["slo_attainment:ghost >= 0.9"])))
