"""KV capacity against vLLM's published start-up logs (benchmarks/data/vllm_kv_capacity.yaml) and the terms of
vLLM's memory profile (sim/engine/sizing.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sim.engine.config import EngineConfig
from sim.engine.sizing import GIB, size_kv_cache
from sim.profiles import load_gpu, load_model

REPO = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("kv_capacity", REPO / "benchmarks" / "kv_capacity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_published_run_within_two_percent():
    rows = _bench().rows()
    assert len(rows) >= 10
    for r in rows:
        assert abs(r["kv_err"]) <= 0.02, r
        if r["tokens_err"] is not None:
            assert abs(r["tokens_err"]) <= 0.02, r


def _sizing(**knobs):
    model, gpu = load_model("Llama-3-8B"), load_gpu("H100-SXM")
    return size_kv_cache(model, gpu, EngineConfig(**knobs).resolve(model.max_model_len, gpu))


def test_non_torch_memory_grows_with_tensor_parallelism():
    tp1, tp2 = _sizing(tensor_parallel_size=1), _sizing(tensor_parallel_size=2)
    assert tp2.non_torch_bytes - tp1.non_torch_bytes > 1.5 * GIB
    old1 = _sizing(engine_version="0.8.5", tensor_parallel_size=1)
    old2 = _sizing(engine_version="0.8.5", tensor_parallel_size=2)
    assert (old1.non_torch_bytes / GIB, old2.non_torch_bytes / GIB) == pytest.approx((1.79, 3.58))


def test_cuda_graph_estimate_is_subtracted_from_021_on():
    new = _sizing(engine_version="0.25.0", gpu_memory_utilization=0.9)
    old = _sizing(engine_version="0.18.0", gpu_memory_utilization=0.9)
    assert old.cudagraph_bytes == 0 and 0.5 * GIB < new.cudagraph_bytes < 1.5 * GIB
    assert old.available_kv_bytes - new.available_kv_bytes == pytest.approx(new.cudagraph_bytes)


def test_vllm_sees_less_than_nvidia_smi():
    h100 = load_gpu("H100-SXM")
    assert h100.vllm_total_bytes == pytest.approx(79.19 * GIB)
    assert h100.vllm_total_bytes < h100.mem_bytes
    for name in ("A100-80GB", "L40S", "H200"):
        gpu = load_gpu(name)
        assert 0 < gpu.mem_bytes - gpu.vllm_total_bytes < GIB


def test_fp8_keeps_the_vocabulary_weights_in_bf16():
    bf16, fp8 = _sizing(), _sizing(quantization="fp8")
    model = load_model("Llama-3-8B")
    vocab = 2 * model.vocab_size * model.hidden_size
    assert bf16.weight_bytes - fp8.weight_bytes == pytest.approx(model.params - vocab)
