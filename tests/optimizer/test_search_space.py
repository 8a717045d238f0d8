"""Search spaces: the default space per flavor and target vLLM, overrides, conditions, grid points."""

from __future__ import annotations

import optuna
import pytest
from optimizer_test_helpers import spec_dict

from optimizer import SearchSpace, StudySpec, VllmTarget, default_search_space, params_to_knobs, parse_search_space
from sim.engine.config import EngineConfig
from sim.errors import ConfigError


def _space(flavor="vllm-v1", version="0.33.0", **kwargs) -> SearchSpace:
    return default_search_space(flavor, VllmTarget.parse(version), max_model_len=4096, **kwargs)


def test_default_v1_space_has_the_issue_knobs():
    space = _space()
    assert space.names == ["max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "kv_cache_dtype",
                           "block_size", "preemption_mode", "kv_offloading_size_gb", "watermark",
                           "reserved_kv_fraction", "admission_policy", "admission_headroom"]
    assert space["max_num_seqs"].log and space["max_num_batched_tokens"].log
    assert space["preemption_mode"].choices == ("recompute", "offload")
    assert space["kv_offloading_size_gb"].when == (("preemption_mode", ("offload",)),)
    assert space["admission_headroom"].when == (("admission_policy", ("predicted",)),)


def test_default_space_follows_the_target_version():
    # --watermark exists from 0.25 (flag data) so a ">=0.18" target cannot use it; 0.10.2 has no offloading.
    assert "watermark" not in _space(version=">=0.18").names
    assert "kv_offloading_size_gb" in _space(version=">=0.18").names
    names = _space(version="0.10.2").names
    assert "kv_offloading_size_gb" not in names and "preemption_mode" not in names


def test_default_v0_space_swaps():
    space = _space("vllm-v0", "0.8.5")
    assert space["preemption_mode"].choices == ("recompute", "swap")
    assert space["swap_space_gb"].when == (("preemption_mode", ("swap",)),)
    assert "watermark" not in space.names and "kv_offloading_size_gb" not in space.names
    # Without chunked prefill V0 needs a budget of at least max_model_len.
    assert space["max_num_batched_tokens"].low >= 4096
    assert space["block_size"].choices == (8, 16, 32)


def test_fixed_knobs_leave_the_space():
    space = _space(fixed={"kv_cache_dtype": "fp8", "num_gpu_blocks_override": 500, "kv_offloading_size_gb": 16.0})
    for name in ("kv_cache_dtype", "gpu_memory_utilization", "preemption_mode", "kv_offloading_size_gb"):
        assert name not in space.names
    assert "scheduling_policy" in _space(priorities_differ=True).names
    assert "scheduling_policy" not in _space().names


def test_overrides_drop_and_replace():
    target = VllmTarget.parse("0.33.0")
    raw = {"max_num_seqs": {"low": 16, "high": 256, "log": True}, "watermark": None, "admission_policy": None,
           "kv_cache_dtype": ["fp8"]}
    space = parse_search_space(raw, "vllm-v1", target, fixed={}, max_model_len=4096)
    assert space["max_num_seqs"].low == 16 and space["max_num_seqs"].high == 256
    assert "watermark" not in space.names
    # The default child of a dropped parent goes too.
    assert "admission_headroom" not in space.names
    assert space["kv_cache_dtype"].choices == ("fp8",)
    only = parse_search_space({"base": "none", "max_num_seqs": [32, 64]}, "vllm-v1", target, fixed={},
                              max_model_len=4096)
    assert only.names == ["max_num_seqs"]
    with pytest.raises(ConfigError) as info:
        parse_search_space({"base": "some"}, "vllm-v1", target, fixed={}, max_model_len=4096)
    assert info.value.field == "search.base"


def test_conditions_decide_which_knobs_a_trial_gets():
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_offload = seen_recompute = False
    for _ in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        study.tell(trial, 0.0)
        assert ("kv_offloading_size_gb" in params) == (params["preemption_mode"] == "offload")
        assert ("admission_headroom" in params) == (params["admission_policy"] == "predicted")
        knobs = params_to_knobs(params, "vllm-v1")
        assert "preemption_mode" not in knobs
        EngineConfig.from_dict({"flavor": "vllm-v1", "max_model_len": 4096, **knobs})  # every draw is a config
        if params["preemption_mode"] == "offload":
            seen_offload = True
            assert knobs["kv_offloading_size_gb"] >= 4
        else:
            seen_recompute = True
            assert "kv_offloading_size_gb" not in knobs
        # Stepped floats come back clean.
        assert round(params["gpu_memory_utilization"], 2) == params["gpu_memory_utilization"]
    assert seen_offload and seen_recompute


def test_suggestions_are_seeded():
    space = _space()

    def draws(seed):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3))
        out = []
        for i in range(6):
            trial = study.ask()
            out.append(space.suggest(trial))
            study.tell(trial, float(i))
        return out

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_grid_points():
    spec = StudySpec.from_dict(spec_dict(
        sampler={"name": "grid"},
        search={"base": "none", "max_num_seqs": {"low": 16, "high": 256, "log": True, "grid_points": 5},
                "kv_cache_dtype": ["auto", "fp8"],
                "gpu_memory_utilization": {"low": 0.8, "high": 0.95, "step": 0.05},
                "max_num_batched_tokens": {"low": 512, "high": 8192, "grid": [512, 2048, 8192]}}))
    grid = spec.search.grid()
    assert grid["max_num_seqs"] == [16, 32, 64, 128, 256]
    assert grid["kv_cache_dtype"] == ["auto", "fp8"]
    assert grid["gpu_memory_utilization"] == [0.8, 0.85, 0.9, 0.95]
    assert grid["max_num_batched_tokens"] == [512, 2048, 8192]
    assert spec.search.grid_size() == 5 * 2 * 4 * 3
