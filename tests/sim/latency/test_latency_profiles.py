"""Profiles the latency model and the KV sizing need: names, errors, and what fits where."""

from __future__ import annotations

import pytest
from tests.sim.latency._helpers import REQUIRED_GPUS, REQUIRED_MODELS

from sim.engine.config import EngineConfig
from sim.engine.sizing import size_kv_cache
from sim.errors import ConfigError
from sim.profiles import gpu_names, load_gpu, load_model, model_names


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_load(name):
    gpu = load_gpu(name)
    assert gpu.name == name and gpu.mem_gb > 0 and gpu.hbm_bw_gbps > 0 and gpu.bf16_tflops > 0 and gpu.source
    assert name in gpu_names()


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_required_models_load(name):
    model = load_model(name)
    assert model.name == name and model.params_b > 0 and model.num_layers > 0 and model.source
    assert name in model_names()


def test_aliases_and_case_resolve():
    assert load_gpu("h100").name == "H100-SXM"
    assert load_model("llama-3.3-70b").name == "Llama-3-70B"


def test_unknown_gpu_names_the_field():
    with pytest.raises(ConfigError) as err:
        load_gpu("B300")
    assert err.value.field == "gpu" and "B300" in str(err.value) and str(err.value).startswith("gpu:")


def test_unknown_model_names_the_field():
    with pytest.raises(ConfigError) as err:
        load_model("Llama-9-1B")
    assert err.value.field == "model" and "Llama-9-1B" in str(err.value)


def test_field_name_is_the_callers():
    with pytest.raises(ConfigError) as err:
        load_gpu("nope", field="replay.gpu")
    assert err.value.field == "replay.gpu"


def test_llama3_70b_does_not_fit_one_h100():
    """141 GB of bf16 weights on an 80 GB part: vLLM refuses to start, and so does the sizing."""
    model, gpu = load_model("Llama-3-70B"), load_gpu("H100-SXM")
    config = EngineConfig(tensor_parallel_size=1).resolve(model.max_model_len)
    with pytest.raises(ConfigError) as err:
        size_kv_cache(model, gpu, config)
    assert err.value.field == "gpu_memory_utilization" and "Llama-3-70B" in str(err.value)


def test_llama3_70b_fits_two_h100s():
    """vLLM serves Llama-3-70B bf16 at TP2 on 80 GB H100s (80 GiB each) with a few GB of KV cache."""
    model, gpu = load_model("Llama-3-70B"), load_gpu("H100-SXM")
    sizing = size_kv_cache(model, gpu, EngineConfig(tensor_parallel_size=2).resolve(model.max_model_len))
    assert sizing.num_gpu_blocks * 16 >= model.max_model_len


def test_gpu_memory_is_what_the_driver_reports():
    """The marketed '80GB' of A100/H100 is 80 GiB (nvidia-smi 81920 / 81559 MiB), not 80e9 bytes."""
    assert load_gpu("A100-80GB").mem_bytes == pytest.approx(81920 * 2**20, rel=1e-3)
    assert load_gpu("H100-SXM").mem_bytes == pytest.approx(81559 * 2**20, rel=1e-3)
