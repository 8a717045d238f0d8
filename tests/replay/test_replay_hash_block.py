"""The replay builds a shared-prefix trace's prompts with the workload's hash block size (issue 32): a trace whose
lengths were scaled carries a smaller block (``hash_block_tokens``, a trace and workload option), and the replayed
prompts must share the blocks that the simulation of the same workload shares (was: always Mooncake's 512)."""

from __future__ import annotations

import json

import pandas as pd

from optimizer.cli import main
from replay.loadgen import ReplayOptions, _Replay
from replay_test_helpers import MODEL
from sim.workload import RequestClass, Workload

#: Two requests whose hash ids share the first block only.
IDS = [[1, 2], [1, 3]]


def _workload(hash_block_tokens: int | None) -> Workload:
    df = pd.DataFrame({"request_id": [0, 1], "class": ["c", "c"], "arrival_s": [0.0, 1.0],
                       "prompt_tokens": [200, 200], "output_tokens": [4, 4]})
    df["hash_ids"] = IDS
    workload = Workload(df, {"c": RequestClass("c")}, source="test")
    return workload if hash_block_tokens is None else workload.with_hash_block_tokens(hash_block_tokens)


def _prompts(workload: Workload, options: ReplayOptions | None = None) -> list[list[int]]:
    replayer = _Replay("http://127.0.0.1:9", workload, options or ReplayOptions())
    return [json.loads(replayer._body(i))["prompt"] for i in range(2)]


def test_the_prompts_share_the_workloads_hash_blocks():
    a, b = _prompts(_workload(64))
    assert a[:64] == b[:64] and a[64:128] != b[64:128]  # block 1 shared, blocks 2 and 3 differ
    # Mooncake's 512 by default: both 200-token prompts lie inside hash id 1's block.
    a, b = _prompts(_workload(None))
    assert a == b
    # An explicit ReplayOptions.hash_block_tokens still wins.
    a, b = _prompts(_workload(None), ReplayOptions(hash_block_tokens=64))
    assert a[:64] == b[:64] and a[64:128] != b[64:128]


def test_kvtune_replay_takes_the_hash_block_size(shared_twin, tmp_path, capsys):
    trace = tmp_path / "scaled-mooncake.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 500 * i, "input_length": 200, "output_length": 4,
                                         "hash_ids": ids}) + "\n" for i, ids in enumerate(IDS)))
    args = ["replay", "--url", shared_twin, "--model", MODEL, "--trace", str(trace), "--format", "mooncake",
            "--speed", "20", "--sample-interval", "0.1"]
    assert main([*args, "--hash-block-tokens", "0", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--hash-block-tokens" in err and "0" in err, err
    assert main([*args, "--hash-block-tokens", "64", "--out", str(tmp_path / "ok")]) == 0, capsys.readouterr().err
