"""Export per target vLLM: recommended.yaml holds only flags that release has (optimizer/data/vllm_flags.yaml),
V0 flags (--preemption-mode, --swap-space) only for old targets, kvtune's own policies only as comments."""

from __future__ import annotations

import json

import pytest
import yaml
from optimizer_test_helpers import spec_dict

from optimizer import InProcessExecutor, StudySpec, Tuner, VllmTarget, export_study, vllm_config
from optimizer._vllm_config import render_recommended_yaml

SMALL = {"trace": "bundled", "classes": {"conv": {"slo": {"e2e_p99_s": 40.0}}}, "max_requests": 120}


def _spec(**changes) -> StudySpec:
    return StudySpec.from_dict(spec_dict(workload=SMALL, **changes))


def _assert_deployable(text: str, target: VllmTarget) -> dict:
    flags = yaml.safe_load(text)
    assert isinstance(flags, dict) and flags
    unknown = set(flags) - target.flags
    assert not unknown, f"not flags of vLLM {target}: {sorted(unknown)}"
    for key, value in flags.items():
        if value is False:
            assert key in target.negatable, key
        assert not isinstance(value, (dict, list)), key
    return flags


@pytest.mark.parametrize(
    ("flavor", "version", "knobs", "expect", "forbid"),
    [
        ("vllm-v0", "0.8.5", {"preemption_mode": "swap", "swap_space_gb": 16, "max_num_seqs": 64},
         {"preemption-mode": "swap", "swap-space": 16.0, "max-num-seqs": 64, "enable-chunked-prefill": False},
         {"kv-offloading-size", "watermark"}),
        ("vllm-v0", "0.10.2", {"preemption_mode": "recompute"},
         {"preemption-mode": "recompute"}, {"swap-space", "kv-offloading-size"}),
        ("vllm-v1", ">=0.18", {"kv_offloading_size_gb": 32, "kv_cache_dtype": "fp8", "reserved_kv_fraction": 0.1},
         {"kv-offloading-size": 32.0, "kv-offloading-backend": "native", "kv-cache-dtype": "fp8"},
         {"preemption-mode", "swap-space", "watermark", "reserved-kv-fraction"}),
        ("vllm-v1", "0.33.0", {"watermark": 0.02, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False},
         {"watermark": 0.02, "enable-prefix-caching": False, "scheduler-reserve-full-isl": False},
         {"swap-space"}),
        # vLLM 0.8.5's CacheConfig default is 0.9 (0.92 only from 0.25 on: sim/data/vllm_defaults.yaml).
        ("vllm-v1", "0.8.5", {"max_num_seqs": 128}, {"max-num-seqs": 128, "gpu-memory-utilization": 0.9},
         {"kv-offloading-size", "preemption-mode", "swap-space"}),
    ],
)
def test_recommended_yaml_keys_are_flags_of_the_target(flavor, version, knobs, expect, forbid):
    spec = _spec(flavor=flavor, vllm_version=version)
    target = spec.vllm_version
    full = {**spec.fixed_knobs(), **knobs}
    flags, policies, notes = vllm_config(full, spec)
    text = render_recommended_yaml(flags, policies, notes, ["test"])
    loaded = _assert_deployable(text, target)
    for key, value in expect.items():
        assert loaded[key] == value, (key, loaded.get(key))
    assert not (forbid & set(loaded))
    assert loaded["max-model-len"] == 4096 and loaded["tensor-parallel-size"] == 1
    if knobs.get("reserved_kv_fraction"):
        assert policies == {"reserved_kv_fraction": 0.1}
        assert "# kvtune_policies:" in text and "#   reserved_kv_fraction: 0.1" in text
    if flavor == "vllm-v0":
        assert any("VLLM_USE_V1=0" in n for n in notes)


def test_flags_a_target_lacks_become_notes():
    spec = _spec(vllm_version=">=0.18")
    flags, _, notes = vllm_config(spec.fixed_knobs(), spec)
    assert "scheduler-reserve-full-isl" not in flags
    assert any("--scheduler-reserve-full-isl" in n for n in notes)


@pytest.mark.parametrize(
    ("flavor", "version", "engine", "present", "absent"),
    [
        ("vllm-v0", "0.8.5", {"max_model_len": 4096, "preemption_mode": "swap", "swap_space_gb": 16},
         {"preemption-mode", "swap-space"}, {"kv-offloading-size"}),
        ("vllm-v1", ">=0.18", {"max_model_len": 4096, "kv_offloading_size_gb": 16},
         {"kv-offloading-size", "kv-offloading-backend"}, {"preemption-mode", "swap-space"}),
    ],
)
def test_export_of_a_study_per_target(tmp_path, flavor, version, engine, present, absent):
    d = spec_dict(workload=SMALL, flavor=flavor, vllm_version=version, engine=engine,
                  search={"base": "none", "max_num_seqs": [32, 128]}, budget={"trials": 2})
    spec = StudySpec.from_dict(d)
    Tuner(spec, out=tmp_path / "run", executor=InProcessExecutor(), progress=open("/dev/null", "w")).run()
    result = export_study(spec, out=tmp_path / "export", study_out=tmp_path / "run")
    text = (tmp_path / "export" / "recommended.yaml").read_text()
    loaded = _assert_deployable(text, spec.vllm_version)
    assert present <= set(loaded) and not (absent & set(loaded))
    doc = json.loads((tmp_path / "export" / "recommended.json").read_text())
    assert doc["vllm_config"] == loaded
    assert doc["vllm_version"] == version
    assert doc["vllm_flag_sources"] and all("arg_utils.py" in s for s in doc["vllm_flag_sources"])
    assert set(doc["predicted"]) == {"recommended", "default"}
    assert "conv" in doc["predicted"]["default"]["classes"]
    assert result.trial == doc["trial"]
    # Robustness: five perturbations, verdicts consistent with their rows; under the unperturbed model the
    # recommendation's own prediction lies between the +-10% step-time runs.
    rows = doc["robustness"]["perturbations"]
    assert len(rows) == 5 and all("error" not in r for r in rows)
    assert doc["robustness"]["meets_slos_under_all"] == all(r["meets_all_slos"] for r in rows)
    assert doc["robustness"]["beats_default_under_all"] == all(r["beats_default"] for r in rows)
    fast, slow = rows[2]["recommended_output_tokens_per_s"], rows[3]["recommended_output_tokens_per_s"]
    assert fast >= doc["predicted"]["recommended"]["output_tokens_per_s"] >= slow
    assert "# robustness kv_blocks -5%:" in text
