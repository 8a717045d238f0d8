"""Bad input gets one clear error naming the file, line or field (no traceback from the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optimizer.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


@pytest.mark.parametrize(
    "content, fmt, needle",
    [
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-3,5\n", None, ":3"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,ten,5\n", None, ":3"),
        ("arrival_s,prompt_tokens\n0,10\n", "normalized", "output_tokens"),
        ("arrival_s,prompt_tokens\n0,10\n", None, "format"),
    ],
)
def test_malformed_trace_is_one_line_naming_file_and_line(tmp_path, content, fmt, needle):
    trace = tmp_path / "bad.csv"
    trace.write_text(content)
    extra = ["--format", fmt] if fmt else []
    proc = _cli("simulate", "--trace", str(trace), *extra, "--out", str(tmp_path / "out"))
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert any("bad.csv" in line and needle in line for line in err), proc.stderr


@pytest.mark.parametrize("flag, value, field", [("--model", "Llama-9-1B", "--model"), ("--gpu", "B300", "--gpu")])
def test_unknown_model_or_gpu(tmp_path, flag, value, field):
    proc = _cli("simulate", "--max-requests", "5", flag, value, "--out", str(tmp_path / "o"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert field in proc.stderr and value in proc.stderr


def test_unknown_knob_and_bad_value(tmp_path):
    proc = _cli("simulate", "--max-requests", "5", "--set", "max_num_seq=8", "--out", str(tmp_path / "o"))
    assert proc.returncode != 0 and "max_num_seq" in proc.stderr and "max_num_seqs" in proc.stderr
    proc = _cli("simulate", "--max-requests", "5", "--set", "max_num_seqs=-1", "--out", str(tmp_path / "o"))
    assert proc.returncode != 0 and "max_num_seqs" in proc.stderr and "Traceback" not in proc.stderr


def test_cache_that_cannot_hold_one_max_length_request():
    wl = make_workload([(0.0, 10, 5)])
    with pytest.raises(ConfigError) as info:
        Simulation(wl, EngineConfig(num_gpu_blocks_override=100), load_model("Llama-3-8B"), load_gpu("H100-SXM"))
    assert info.value.field == "num_gpu_blocks_override" and "8192" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Simulation(wl, EngineConfig(gpu_memory_utilization=0.2), load_model("Llama-3-8B"), load_gpu("L40S"))
    assert info.value.field == "gpu_memory_utilization"


@pytest.mark.parametrize("knobs, text", [
    ({"enable_prefix_caching": 2}, "enable_prefix_caching: must be true or false, got 2"),
    ({"async_scheduling": "no"}, "async_scheduling: must be true or false, got 'no'"),
    ({"tensor_parallel_size": True}, "tensor_parallel_size: must be one of [1, 2, 4, 8], got True"),
    ({"max_num_seqs": 64.0}, "max_num_seqs: must be an integer, got 64.0"),
    ({"watermark": 0.7}, "watermark: must be in [0.0, 0.5], got 0.7"),
])
def test_a_knob_of_the_wrong_type_is_one_error_not_a_silent_fix(knobs, text):
    with pytest.raises(ConfigError) as info:
        EngineConfig(**knobs)
    assert str(info.value) == text


def test_knob_of_the_other_flavor_is_rejected():
    with pytest.raises(ConfigError, match="swap_space_gb"):
        EngineConfig(flavor="vllm-v1", swap_space_gb=4)
    with pytest.raises(ConfigError, match="watermark"):
        EngineConfig.from_dict({"flavor": "vllm-v0", "watermark": "0.1"})


def test_same_inputs_and_seed_give_identical_tables():
    from sim.workload.classes import RequestClass

    classes = {"default": RequestClass("default", timeout_s=0.4, cancel_probability=0.3, cancel_after_s=(0.0, 0.5))}
    rows = [(i * 0.01, 30 + 7 * i % 90, 5 + 3 * i % 40) for i in range(60)]
    runs = []
    for _ in range(2):
        wl = make_workload(rows, classes)
        sim = Simulation(wl, EngineConfig(num_gpu_blocks_override=40, max_model_len=256), load_model("Llama-3-8B"),
                         load_gpu("H100-SXM"), seed=7)
        runs.append(sim.run())
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].steps.equals(runs[1].steps)
    other = Simulation(make_workload(rows, classes), EngineConfig(num_gpu_blocks_override=40, max_model_len=256),
                       load_model("Llama-3-8B"), load_gpu("H100-SXM"), seed=8).run()
    assert not other.requests["status"].equals(runs[0].requests["status"]) or not other.requests.equals(runs[0].requests)


def test_user_errors_survive_pickling():
    """A trial's ConfigError/TraceError crosses a Ray worker boundary by pickling; its message must arrive intact."""
    import pickle

    from sim.errors import TraceError

    error = pickle.loads(pickle.dumps(ConfigError("gpu_memory_utilization", "weights do not fit")))
    assert isinstance(error, ConfigError) and error.field == "gpu_memory_utilization"
    assert str(error) == "gpu_memory_utilization: weights do not fit"
    trace_error = pickle.loads(pickle.dumps(TraceError("t.csv", 7, "negative prompt_tokens")))
    assert (trace_error.path, trace_error.line, str(trace_error)) == ("t.csv", 7, "t.csv:7: negative prompt_tokens")
