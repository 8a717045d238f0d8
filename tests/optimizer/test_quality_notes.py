"""Quality notes: lower-precision knobs come with published accuracy deltas and their sources; full precision
comes with none, and a value kvtune has no figures for is never called full precision."""

import re

import pytest

from optimizer.quality import PRECISION_KNOBS, format_quality_notes, quality_notes
from sim.errors import ConfigError


def _check_source(src):
    assert src["url"].startswith("https://") and src["title"] and src["date"]


@pytest.mark.parametrize("value", ["fp8", "fp8_e4m3", "fp8_e5m2", "FP8"])
def test_fp8_kv_gives_a_note_with_sourced_figures(value):
    (note,) = quality_notes({"kv_cache_dtype": value})
    assert note["knob"] == "kv_cache_dtype" and note["value"] == value and note["known"]
    assert "KV cache" in note["lowers"] and note["summary"]
    assert note["findings"] and note["sources"]
    for finding in note["findings"]:
        _check_source(finding["source"])
        assert finding["source"] in note["sources"]
        if finding["recovery_pct"] is None:
            assert finding["delta"] == pytest.approx(finding["lowered"] - finding["baseline"])
    for caveat in note["caveats"]:
        _check_source(caveat["source"])


def test_fp8_kv_quotes_the_vllm_measurement():
    (note,) = quality_notes({"kv_cache_dtype": "fp8"})
    gsm8k = next(f for f in note["findings"] if "flexible-extract" in f["benchmark"])
    assert (gsm8k["baseline"], gsm8k["lowered"]) == (0.938, 0.942)
    assert gsm8k["source"]["url"] == "https://github.com/vllm-project/vllm/pull/23647"
    assert gsm8k["source"]["date"] == "2025-08-26"
    assert any("quantized_kvcache" in s["url"] for s in note["sources"])  # vLLM's Quantized KV Cache page


def test_e5m2_is_its_own_note():
    (e4m3,) = quality_notes({"kv_cache_dtype": "fp8_e4m3"})
    (e5m2,) = quality_notes({"kv_cache_dtype": "fp8_e5m2"})
    assert "E5M2" in e5m2["lowers"] and e5m2["findings"] != e4m3["findings"]
    assert all(f["delta"] < 0 for f in e5m2["findings"])  # every published e5m2 run lost GSM8K points


def test_fp8_weights_note():
    (note,) = quality_notes({"quantization": "fp8"})
    assert note["knob"] == "quantization" and note["known"] and "weights" in note["lowers"]
    mmlu = next(f for f in note["findings"] if f["benchmark"].startswith("MMLU"))
    assert (mmlu["baseline"], mmlu["lowered"]) == (66.60, 66.27)
    assert mmlu["source"]["url"] == "https://huggingface.co/neuralmagic/Meta-Llama-3-8B-Instruct-FP8"
    assert any(f["recovery_pct"] == 99.7 and f["delta"] is None for f in note["findings"])


def test_both_knobs_give_two_notes_in_order():
    notes = quality_notes({"quantization": "fp8", "kv_cache_dtype": "fp8", "max_num_seqs": 64})
    assert [n["knob"] for n in notes] == list(PRECISION_KNOBS)


@pytest.mark.parametrize("knobs", [
    {}, {"kv_cache_dtype": "auto"}, {"quantization": "none"}, {"kv_cache_dtype": "auto", "quantization": "none"},
    {"kv_cache_dtype": None, "quantization": None}, {"max_num_seqs": 256},
])
def test_full_precision_gives_no_note(knobs):
    assert quality_notes(knobs) == []


@pytest.mark.parametrize("knob, value", [("kv_cache_dtype", "fp8_inc"), ("kv_cache_dtype", "bfloat16"),
                                         ("kv_cache_dtype", "int4"), ("quantization", "awq"),
                                         ("quantization", "gptq")])
def test_an_unknown_value_is_not_called_full_precision(knob, value):
    (note,) = quality_notes({knob: value})
    assert note["knob"] == knob and note["value"] == value and note["known"] is False
    assert "no published accuracy figure" in note["summary"] and "not assume" in note["summary"]
    assert note["findings"] == [] and note["sources"] == []


@pytest.mark.parametrize("knobs, match", [
    ({"kv_cache_dtype": 8}, "kv_cache_dtype: must be a string"),
    ({"quantization": True}, "quantization: must be a string"),
    (["kv_cache_dtype"], "knobs: must be a mapping"),
])
def test_a_non_string_value_is_a_config_error(knobs, match):
    with pytest.raises(ConfigError, match=match):
        quality_notes(knobs)


def test_notes_are_copies():
    (note,) = quality_notes({"kv_cache_dtype": "fp8"})
    note["findings"].clear()
    note["sources"][0]["url"] = "x"
    (again,) = quality_notes({"kv_cache_dtype": "fp8"})
    assert again["findings"] and again["sources"][0]["url"].startswith("https://")


def test_formatted_notes_name_every_source():
    notes = quality_notes({"kv_cache_dtype": "fp8", "quantization": "fp8"})
    text = format_quality_notes(notes)
    for note in notes:
        for src in note["sources"]:
            assert src["url"] in text
    assert re.search(r"0\.938 -> 0\.942 \(\+0\.004\)", text)
    assert format_quality_notes([]) == ""


def _malformed_copy(tmp_path, edit):
    """A copy of the bundled quality.yaml with ``edit`` applied to its parsed data."""
    import copy
    from importlib import resources

    import yaml

    data = yaml.safe_load(resources.files("optimizer").joinpath("data", "quality.yaml").read_text())
    data = copy.deepcopy(data)
    edit(data)
    path = tmp_path / "quality.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_bundled_file_reads_as_the_table():
    from importlib import resources

    from optimizer.quality import _read_table, _table

    assert _read_table(resources.files("optimizer").joinpath("data", "quality.yaml")) == _table()


def _set(path, value):
    def edit(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


@pytest.mark.parametrize("keys, value, message", [
    (("knobs", "kv_cache_dtype", "values", "fp8", "lowers"), 7,
     "knobs.kv_cache_dtype.values.fp8.lowers: must be a non-empty string, got 7"),
    (("knobs", "kv_cache_dtype", "values", "fp8", "findings", 0, "baseline"), "high",
     "knobs.kv_cache_dtype.values.fp8.findings[0].baseline: must be a number, got 'high'"),
    (("knobs", "kv_cache_dtype", "values", "fp8", "findings"), {"a": 1},
     "knobs.kv_cache_dtype.values.fp8.findings: must be a list, got {'a': 1}"),
    (("sources", "vllm_kvcache_docs", "url"), "http://docs.vllm.ai",
     "sources.vllm_kvcache_docs.url: must be an https URL, got 'http://docs.vllm.ai'"),
    (("knobs", "quantization", "full_precision"), None,
     "knobs.quantization.full_precision: must be a list, got None"),
])
def test_a_malformed_quality_file_gives_the_one_form(tmp_path, keys, value, message):
    """issue 33: '<field path>: must be <expected>, got <value> (in <file>)' (sim.fields), not '<file>: <key>'."""
    from optimizer.quality import _read_table

    path = _malformed_copy(tmp_path, _set(keys, value))
    with pytest.raises(ConfigError) as info:
        _read_table(path)
    assert str(info.value) == f"{message} (in {path})"
    assert info.value.field == message.split(": ")[0]


def test_a_finding_naming_an_unknown_source(tmp_path):
    from optimizer.quality import _read_table

    path = _malformed_copy(tmp_path, _set(("knobs", "quantization", "values", "fp8", "findings", 0, "source"), "blog"))
    with pytest.raises(ConfigError) as info:
        _read_table(path)
    text = str(info.value)
    assert text.startswith("knobs.quantization.values.fp8.findings[0].source: must be a key of sources "
                           "(vllm_kvcache_docs, ")
    assert text.endswith(f"got 'blog' (in {path})")


def test_a_quality_file_that_is_not_yaml_is_a_file_error(tmp_path):
    from optimizer.quality import _read_table

    path = tmp_path / "quality.yaml"
    path.write_text("sources: [\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: not valid YAML"):
        _read_table(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError) as info:
        _read_table(path)
    assert str(info.value) == f"{path}: must be a mapping (sources:, knobs:), got list"
