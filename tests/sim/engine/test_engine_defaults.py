"""The engine's defaults per vLLM release and device (sim/data/vllm_defaults.yaml, read from the wheels'
engine/arg_utils.py get_batch_defaults and config/cache.py), and every "engine default config" resolving to them."""

from __future__ import annotations

import dataclasses

import pytest

from sim.engine.config import EngineConfig
from sim.engine.defaults import defaults_table, engine_defaults, release_defaults
from sim.errors import ConfigError
from sim.profiles import load_gpu

GIB = 1024**3


def _device(name: str, gib: float):
    return dataclasses.replace(load_gpu("H100-SXM"), name=name, mem_gb=gib * GIB / 1e9)


@pytest.mark.parametrize(("gpu", "tokens", "seqs"), [
    ("H100-SXM", 8192, 1024),   # 79.6 GiB, not an A100
    ("H200", 8192, 1024),       # 140.4 GiB: below the 160 GiB tier
    ("GH200", 8192, 1024),
    ("A100-80GB", 2048, 256),   # >= 70 GiB but excluded by name (vLLM PR #17885)
    ("L40S", 2048, 256),        # 45 GiB
])
def test_vllm_033_batch_defaults_by_device(gpu, tokens, seqs):
    d = engine_defaults("vllm-v1", "0.33.0", load_gpu(gpu))
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (tokens, seqs)
    assert d.gpu_memory_utilization == 0.92 and d.async_scheduling is True


def test_160_gib_tier_exists_from_032_only():
    big = _device("B200", 179.0)
    assert engine_defaults("vllm-v1", "0.33.0", big).max_num_batched_tokens == 16384
    assert engine_defaults("vllm-v1", "0.32.0", big).max_num_batched_tokens == 16384
    assert engine_defaults("vllm-v1", "0.25.0", big).max_num_batched_tokens == 8192
    # The tier boundary is inclusive: 160 GiB exactly is the large tier, just below is not.
    assert engine_defaults("vllm-v1", "0.33.0", _device("X", 160.0)).max_num_seqs == 1024
    assert engine_defaults("vllm-v1", "0.33.0", _device("X", 159.9)).max_num_batched_tokens == 8192
    assert engine_defaults("vllm-v1", "0.33.0", _device("X", 69.9)).max_num_batched_tokens == 2048


def test_cpu_engine_defaults_scale_with_workers():
    cpu = _device("CPU-x86", 64.0)
    d1 = engine_defaults("vllm-v1", "0.33.0", cpu, tensor_parallel=1)
    d2 = engine_defaults("vllm-v1", "0.33.0", cpu, tensor_parallel=2)
    assert (d1.max_num_batched_tokens, d1.max_num_seqs) == (2048, 128)
    assert (d2.max_num_batched_tokens, d2.max_num_seqs) == (4096, 256)


def test_older_releases_differ():
    a100 = load_gpu("A100-80GB")
    # 0.8.5 had no A100 exception and 0.9 memory utilization; no async scheduling flag.
    old = engine_defaults("vllm-v1", "0.8.5", a100)
    assert (old.max_num_batched_tokens, old.max_num_seqs, old.gpu_memory_utilization) == (8192, 1024, 0.9)
    assert old.async_scheduling is False
    assert engine_defaults("vllm-v1", "0.11.0", load_gpu("H100-SXM")).async_scheduling is False
    assert engine_defaults("vllm-v1", "0.18.0", load_gpu("H100-SXM")).async_scheduling is True
    assert engine_defaults("vllm-v1", "0.18.0", a100).gpu_memory_utilization == 0.9
    assert engine_defaults("vllm-v1", "0.25.0", a100).gpu_memory_utilization == 0.92


def test_v0_defaults_follow_the_model_length():
    h100 = load_gpu("H100-SXM")
    short = engine_defaults("vllm-v0", "0.8.5", h100, max_model_len=8192)
    assert (short.max_num_seqs, short.max_num_batched_tokens, short.enable_chunked_prefill) == (256, 8192, False)
    long = engine_defaults("vllm-v0", "0.8.5", h100, max_model_len=131072)
    assert (long.max_num_batched_tokens, long.enable_chunked_prefill) == (2048, True)
    assert engine_defaults("vllm-v0", "0.8.5", h100, max_model_len=1024).max_num_batched_tokens == 2048


def test_a_release_between_rows_takes_the_row_below():
    assert release_defaults("0.21.0").version == "0.18.0"
    assert release_defaults("0.33.1").version == "0.33.0"
    assert [r.version for r in defaults_table()] == sorted((r.version for r in defaults_table()),
                                                           key=lambda v: tuple(map(int, v.split("."))))


def test_unknown_or_too_old_release_is_a_config_error():
    with pytest.raises(ConfigError, match="engine_version"):
        EngineConfig(engine_version="0.5.0")
    with pytest.raises(ConfigError, match="engine_version"):
        EngineConfig(engine_version="latest-ish")
    with pytest.raises(ConfigError, match="V0"):
        EngineConfig(flavor="vllm-v0", engine_version="0.11.0").resolve(8192, load_gpu("H100-SXM"))


def test_resolve_fills_only_unset_knobs():
    l40s = load_gpu("L40S")
    r = EngineConfig().resolve(8192, l40s)
    assert (r.max_num_batched_tokens, r.max_num_seqs, r.gpu_memory_utilization, r.async_scheduling) == (
        2048, 256, 0.92, True)
    assert r.engine_version == "0.33.0"
    mine = EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, async_scheduling=False).resolve(8192, l40s)
    assert (mine.max_num_batched_tokens, mine.max_num_seqs, mine.async_scheduling) == (4096, 64, False)
    # An unknown device is vLLM's own fallback when the device query fails (memory 0): the small tier.
    assert EngineConfig().resolve(8192).max_num_batched_tokens == 2048


def test_study_default_config_uses_the_study_gpu_and_version():
    from optimizer import StudySpec

    def spec(gpu, version):
        return StudySpec.from_dict({
            "name": "d", "model": "Llama-3-8B", "gpu": gpu, "vllm_version": version,
            "workload": {"trace": "bundled", "max_requests": 10},
            "search": {"max_num_seqs": [64, 128]}, "objectives": ["output_tokens_per_s"],
        })

    h100 = spec("H100-SXM", "0.33.0")
    resolved = h100.default_config().resolve(8192, load_gpu("H100-SXM"))
    assert (resolved.max_num_batched_tokens, resolved.max_num_seqs) == (8192, 1024)
    assert h100.fixed_knobs()["engine_version"] == "0.33.0"
    old = spec("H100-SXM", "0.18.0").default_config().resolve(8192, load_gpu("H100-SXM"))
    assert old.gpu_memory_utilization == 0.9
    # A floor target is simulated with the newest listed release.
    assert spec("L40S", ">=0.18").fixed_knobs()["engine_version"] == "0.33.0"


# ---- what a run's summary says about releases (issue 32: summary.json said 0.33.0 for a 0.32 prediction) -----
def test_release_record_says_what_was_targeted_and_what_was_simulated():
    from sim.engine.defaults import release_record

    device = load_gpu("vllm-cpu-1core")

    def record(version, flavor="vllm-v1"):
        asked = EngineConfig(flavor=flavor, engine_version=version)
        return release_record(asked.engine_version, asked.resolve(2048, device))

    exact = record("0.32.0")
    assert (exact["engine_version_targeted"], exact["engine_version_simulated"]) == ("0.32.0", "0.32.0")
    assert exact["engine_rules_release"] == "0.33.0" and "rules are vLLM 0.33.0's" in exact["engine_version_note"]
    between = record("0.32.1")
    assert (between["engine_version_targeted"], between["engine_version_simulated"]) == ("0.32.1", "0.32.0")
    assert "nearest listed release at or below" in between["engine_version_note"]
    unnamed = record(None)
    assert unnamed["engine_version_targeted"] is None and unnamed["engine_version_simulated"] == "0.33.0"
    assert "no engine_version named" in unnamed["engine_version_note"]
    assert "engine_version_note" not in record("0.33.0")
    v0 = record(None, "vllm-v0")
    assert v0["engine_version_simulated"] == v0["engine_rules_release"] == "0.8.5"


def test_simulate_writes_the_release_record_into_summary_json(tmp_path):
    import json

    from optimizer.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,200,20\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(trace), "--set", "engine_version=0.32.1", "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert (doc["engine_version_targeted"], doc["engine_version_simulated"]) == ("0.32.1", "0.32.0")
    assert doc["config"]["engine_version"] == "0.32.0"
