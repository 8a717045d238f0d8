"""A version range must not span releases that disagree on what kvtune simulated (optimizer/_versions.py
version_validity), and the exported config must parse with the target vLLM's own argument parser."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from optimizer_test_helpers import spec_dict

from optimizer import StudySpec, vllm_config
from optimizer._vllm_config import render_recommended_yaml, target_validity
from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.profiles import load_gpu

SMALL = {"trace": "bundled", "classes": {"conv": {"slo": {"e2e_p99_s": 40.0}}}, "max_requests": 120}
REPO = Path(__file__).resolve().parents[2]


def _spec(**changes) -> StudySpec:
    return StudySpec.from_dict(spec_dict(workload=SMALL, **changes))


def test_a_floor_spanning_different_engines_says_where_it_holds():
    spec = _spec(vllm_version=">=0.18")
    flags, _, notes = vllm_config({**spec.fixed_knobs(), "watermark": 0.02}, spec)
    config = EngineConfig.from_dict({**spec.fixed_knobs(), "watermark": 0.02}).resolve(4096, load_gpu(spec.gpu))
    validity = target_validity(config, spec.vllm_version)
    assert validity["simulated_release"] == "0.33.0"
    assert validity["holds_for"] == ["0.25.0", "0.33.0"]
    assert "has no --watermark" in validity["differs"]["0.18.0"]
    assert any("CUDA-graph" in r for r in validity["differs"]["0.18.0"])
    assert any("differs on 0.18.0" in n for n in notes)
    assert "watermark" not in flags  # 0.18.0 lacks it, so the intersection does too


def test_an_exact_release_holds_for_itself():
    spec = _spec(vllm_version="0.33.0")
    config = EngineConfig.from_dict(spec.fixed_knobs()).resolve(4096, load_gpu(spec.gpu))
    assert target_validity(config, spec.vllm_version) == {"simulated_release": "0.33.0", "holds_for": ["0.33.0"],
                                                          "differs": {}}


def test_async_scheduling_is_written_where_the_flag_exists():
    on = _spec(vllm_version="0.33.0")
    flags, _, _ = vllm_config({**on.fixed_knobs(), "async_scheduling": False}, on)
    assert flags["async-scheduling"] is False
    old = _spec(flavor="vllm-v1", vllm_version="0.8.5")
    flags, _, notes = vllm_config(old.fixed_knobs(), old)
    assert "async-scheduling" not in flags and not any("async" in n for n in notes)  # lock-step there anyway


def _vllm_python() -> str:
    """The vLLM environment the real-engine tests use (``KVTUNE_VLLM_PYTHON``, set by ``.ci/run``); without one
    this test skips, and under CI (``CI=true``) it fails, as tests/real_engine does."""
    from replay.vllm_env import find_vllm

    try:
        return find_vllm().python
    except ConfigError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a real vLLM: {exc}")
        pytest.skip(f"no real vLLM engine configured ({exc})")


def test_exported_config_parses_with_vllm_032(tmp_path):
    python = _vllm_python()
    spec = _spec(vllm_version="0.32.0")
    knobs = {**spec.fixed_knobs(), "max_num_seqs": 64, "max_num_batched_tokens": 4096, "async_scheduling": False,
             "watermark": 0.02, "scheduler_reserve_full_isl": False, "enable_prefix_caching": False,
             "kv_offloading_size_gb": 8.0, "long_prefill_token_threshold": 512, "gpu_memory_utilization": 0.9}
    flags, policies, notes = vllm_config(knobs, spec)
    path = tmp_path / "recommended.yaml"
    path.write_text(render_recommended_yaml(flags, policies, notes, ["test"]))
    proc = subprocess.run([python, str(REPO / "benchmarks" / "tools" / "vllm_parse_config.py"), str(path)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed["vllm"].startswith("0.32")
    for key, value in yaml.safe_load(path.read_text()).items():
        assert parsed["values"][key] == value, key
