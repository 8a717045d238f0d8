"""Tokens per trace hash id (``hash_block_tokens``, issue 32): a trace option, Mooncake's 512 by default.

A trace whose lengths were scaled by ``f`` keeps the prefix sharing of the original when its hash block is scaled
by ``f`` too; with the fixed 512 the ids of a scaled trace map onto the wrong blocks.
"""

from __future__ import annotations

import json

import pytest

from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import MOONCAKE_HASH_BLOCK_TOKENS, Simulation
from sim.workload import WorkloadSpec
from tests.sim.engine.conftest import make_workload

MODEL, GPU = load_model("Llama-3-8B"), load_gpu("H100-SXM")
#: Per request: its hash ids; requests arrive 1 s apart and end before the next arrives (ample cache).
IDS = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]


def _workload(block_tokens: int, suffix: int, hash_block_tokens: int | None = None):
    workload = make_workload([(float(i), len(ids) * block_tokens + suffix, 4) for i, ids in enumerate(IDS)])
    workload.requests["hash_ids"] = IDS
    return workload if hash_block_tokens is None else workload.with_hash_block_tokens(hash_block_tokens)


def _hits(workload, **kwargs) -> list[int]:
    config = EngineConfig(enable_prefix_caching=True, max_model_len=4096)
    table = Simulation(workload, config, MODEL, GPU, latency=LinearStepModel(0.01, 1e-5), **kwargs).run().requests
    return table.sort_values("request_id")["prefix_hit_tokens"].tolist()


def test_default_is_mooncakes_512():
    assert MOONCAKE_HASH_BLOCK_TOKENS == 512
    assert make_workload([(0.0, 10, 2)]).hash_block_tokens == 512


def test_scaled_trace_with_a_matching_hash_block_keeps_its_prefix_hits():
    full = _hits(_workload(512, 100))
    assert full == [0, 1024, 512, 0, 1536]  # shared leading ids x 512 tokens
    scaled = _hits(_workload(64, 12, hash_block_tokens=64))  # lengths / 8, hash block / 8
    assert scaled == [h // 8 for h in full]
    # With the fixed 512 every scaled prompt lies inside its first id's block: requests that share only the first
    # id seem to share their whole prompts.
    assert _hits(_workload(64, 12)) != scaled


def test_the_simulations_argument_still_wins_and_a_block_size_must_divide():
    assert _hits(_workload(64, 12), hash_block_tokens=64) == _hits(_workload(64, 12, hash_block_tokens=64))
    with pytest.raises(ConfigError, match="does not divide the trace's hash block of 24 tokens"):
        _hits(_workload(24, 12, hash_block_tokens=24))


@pytest.mark.parametrize("value", [0, -16, 1.5, True, "64", 10**9])
def test_bad_hash_block_sizes_name_the_key(value):
    with pytest.raises(ConfigError, match=r"workload.hash_block_tokens"):
        WorkloadSpec.from_dict({"trace": "t.jsonl", "hash_block_tokens": value})
    with pytest.raises(ConfigError, match=r"hash_block_tokens"):
        _workload(64, 12).with_hash_block_tokens(value)


def test_spec_option_reaches_the_simulation(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": len(ids) * 64 + 12, "output_length": 4, "hash_ids": ids}
            for i, ids in enumerate(IDS)]
    (tmp_path / "scaled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = WorkloadSpec.from_dict({"trace": "scaled.jsonl", "format": "mooncake", "hash_block_tokens": 64},
                                  base_dir=tmp_path)
    assert spec.to_dict()["hash_block_tokens"] == 64
    assert WorkloadSpec.from_dict(spec.to_dict(), base_dir=tmp_path) == spec
    assert "hash_block_tokens" not in WorkloadSpec.from_dict({"trace": "scaled.jsonl"}).to_dict()
    workload = spec.build()
    assert workload.hash_block_tokens == 64
    assert workload.head(3).hash_block_tokens == 64 and workload.scale_rate(2).hash_block_tokens == 64
    assert _hits(workload) == [0, 128, 64, 0, 192]


def test_a_generator_has_no_hash_ids_to_size():
    with pytest.raises(ConfigError, match="workload.hash_block_tokens"):
        WorkloadSpec.from_dict({"generator": {"duration_s": 10, "classes": {"a": {
                                "rate_rps": 1, "prompt_tokens": {"dist": "constant", "value": 8},
                                "output_tokens": {"dist": "constant", "value": 8}}}},
                                "hash_block_tokens": 64})


def test_concat_needs_one_hash_block_size():
    a, b = _workload(64, 12, 64), _workload(64, 12)
    with pytest.raises(ConfigError, match="hash_block_tokens"):
        a.concat(b)
    assert a.concat(a).hash_block_tokens == 64
