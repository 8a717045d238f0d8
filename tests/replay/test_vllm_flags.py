"""A trial's EngineConfig becomes ``vllm serve`` flags for the target vLLM release (the optimizer's flag data)."""

from __future__ import annotations

import pytest

from replay.flags import config_yaml, engine_args, engine_flags, serve_command
from replay.launcher import twin_command
from sim.engine.config import EngineConfig
from sim.errors import ConfigError


def cfg(**knobs) -> EngineConfig:
    return EngineConfig.from_dict(knobs)


def as_dict(argv: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


def test_v1_knobs_map_to_flags():
    flags = engine_flags(cfg(max_num_seqs=128, max_num_batched_tokens=4096, gpu_memory_utilization=0.9,
                             enable_prefix_caching=False, num_gpu_blocks_override=600, kv_offloading_size_gb=8.0,
                             scheduling_policy="priority"), "0.33.0")
    pairs = as_dict(flags)
    assert pairs["--max-num-seqs"] == "128"
    assert pairs["--max-num-batched-tokens"] == "4096"
    assert pairs["--gpu-memory-utilization"] == "0.9"
    assert pairs["--num-gpu-blocks-override"] == "600"
    assert pairs["--kv-offloading-size"] == "8" and pairs["--kv-offloading-backend"] == "native"
    assert pairs["--scheduling-policy"] == "priority"
    assert pairs["--no-enable-prefix-caching"] is True
    assert "--quantization" not in flags  # "none" has no spelling: left to vLLM's default


def test_unset_knobs_are_left_to_vllm():
    args = engine_args(cfg(), "0.33.0").args
    assert "max-num-batched-tokens" not in args and "gpu-memory-utilization" not in args


def test_v0_flavor_on_an_old_release_pins_the_engine():
    argv, env = serve_command("meta-llama/Meta-Llama-3-8B", cfg(flavor="vllm-v0", preemption_mode="swap",
                                                                swap_space_gb=8.0), vllm_version="0.8.5", port=9000)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B"]
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--preemption-mode") + 1] == "swap" and argv[argv.index("--swap-space") + 1] == "8"
    assert env == {"VLLM_USE_V1": "0"}


def test_what_the_target_cannot_run_is_refused():
    with pytest.raises(ConfigError, match="V0 engine"):
        engine_args(cfg(flavor="vllm-v0"), "0.33.0")
    with pytest.raises(ConfigError, match="reserved_kv_fraction"):
        engine_args(cfg(reserved_kv_fraction=0.1), "0.33.0")
    with pytest.raises(ConfigError, match="scheduler-reserve-full-isl"):
        engine_args(cfg(scheduler_reserve_full_isl=False), "0.11.0")
    loose = engine_args(cfg(reserved_kv_fraction=0.1, max_num_seqs=64), "0.33.0", strict=False)
    assert loose.dropped == ("reserved_kv_fraction",) and loose.args["max-num-seqs"] == 64


def test_config_yaml_and_twin_command_carry_the_same_config():
    config = cfg(max_num_seqs=32, enable_prefix_caching=False, reserved_kv_fraction=0.2)
    assert config_yaml(config.replace(reserved_kv_fraction=0.0), "m")["enable-prefix-caching"] is False
    argv, env = twin_command(config, "Llama-3-8B", "H100", port=1234, speed=10, slack_ms=20)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sorted(sets) == ["enable_prefix_caching=false", "max_num_seqs=32", "reserved_kv_fraction=0.2"]
    assert argv[argv.index("--speed") + 1] == "10.0" and "PYTHONPATH" in env
