"""Launching an installed vLLM: which environment (``--vllm-python`` / ``KVTUNE_VLLM_PYTHON``), its release read
from package metadata, and the command for the CPU build (module entry point, block size multiple of 32,
VLLM_CPU_KVCACHE_SPACE, no tokenizer for a bare model folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from replay.flags import serve_command
from replay.vllm_env import VLLM_PYTHON_ENV, VllmInstall, find_vllm, resolve_vllm_python
from sim.engine.config import EngineConfig
from sim.errors import ConfigError

CPU = VllmInstall(python="/venv/bin/python", version="0.32.0", distribution="vllm-cpu")
GPU = VllmInstall(python="/venv/bin/python", version="0.33.0", distribution="vllm")


def test_no_environment_is_one_clear_error(monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    with pytest.raises(ConfigError, match="no vLLM environment configured: give --vllm-python PATH or set "
                                          "KVTUNE_VLLM_PYTHON"):
        resolve_vllm_python(None)


def test_a_path_that_is_no_python_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="KVTUNE_VLLM_PYTHON: .*not a Python interpreter"):
        resolve_vllm_python(None)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    assert resolve_vllm_python(str(venv)) == str(venv / "bin" / "python")  # a venv folder names its python


def test_an_environment_without_vllm_is_refused():
    with pytest.raises(ConfigError, match="vLLM is not installed in this environment"):
        find_vllm(sys.executable)  # the test interpreter has no vllm


def test_cpu_build_command(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = EngineConfig.from_dict({"block_size": 32, "num_gpu_blocks_override": 100, "max_num_seqs": 8})
    argv, env = serve_command(str(model), config, port=18000, install=CPU, extra_args=("--enforce-eager",))
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    pairs = dict(zip(argv, argv[1:]))
    assert (pairs["--block-size"], pairs["--num-gpu-blocks-override"], pairs["--port"]) == ("32", "100", "18000")
    assert "--skip-tokenizer-init" in argv and argv[-1] == "--enforce-eager"
    assert env["VLLM_CPU_KVCACHE_SPACE"]
    (model / "tokenizer.json").write_text("{}")
    argv, _ = serve_command(str(model), config, install=GPU)
    assert "--skip-tokenizer-init" not in argv  # a model with a tokenizer is served with it


def test_cpu_build_refuses_a_block_size_it_cannot_run():
    with pytest.raises(ConfigError, match="block_size: vllm-cpu 0.32.0 needs a block size that is a multiple of 32, "
                                          "got 16"):
        serve_command("m", EngineConfig(), install=CPU)


def test_gpu_build_takes_block_size_16_and_no_cpu_settings():
    argv, env = serve_command("meta-llama/Meta-Llama-3-8B", EngineConfig.from_dict({"max_num_seqs": 8}), install=GPU)
    pairs = dict(zip(argv, argv[1:]))
    assert (pairs["--block-size"], pairs["--max-num-seqs"]) == ("16", "8") and "VLLM_CPU_KVCACHE_SPACE" not in env


@pytest.mark.skipif(not os.environ.get(VLLM_PYTHON_ENV), reason="no real vLLM configured (KVTUNE_VLLM_PYTHON)")
def test_the_configured_environment_is_read():
    install = find_vllm()
    assert install.version and Path(install.python).is_file()


def _trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n")
    return str(trace)


def test_cli_unreachable_server_is_one_line_and_exit_2(tmp_path, capsys):
    from optimizer.cli import main

    code = main(["replay", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", _trace(tmp_path),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--url: http://127.0.0.1:9 cannot be reached" in err[0]


def test_cli_launch_without_a_vllm_environment_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from optimizer.cli import main

    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    code = main(["replay", "--launch", "vllm", "--model", "m", "--trace", _trace(tmp_path),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no vLLM environment configured" in err[0]


def test_a_local_model_folder_is_its_own_simulator_profile(tmp_path):
    import json

    from replay.backend import guess_sim_model
    from sim.profiles import load_model

    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(json.loads((Path(__file__).with_name("data") / "tiny-llama" /
                                                                "config.json").read_text())))
    assert guess_sim_model(str(folder)) == str(folder.resolve())
    assert load_model(guess_sim_model(str(folder))).num_layers == 4  # calibration re-simulates with it
    assert guess_sim_model("meta-llama/Meta-Llama-3-8B") == "Llama-3-8B"
