"""``kvtune simulate --hash-block-tokens`` (issue 32): a shared-prefix trace whose lengths were scaled carries a
smaller hash block, and the simulation must share the blocks the replay of the same trace shares (``kvtune replay``
takes the same flag, defined once in optimizer/_cli_args.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from optimizer.cli import main

#: Four 200-token prompts whose hash ids share the first id only.
IDS = [[1, 2], [1, 3], [1, 4], [1, 5]]


def _trace(tmp_path):
    trace = tmp_path / "scaled-mooncake.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 2000 * i, "input_length": 200, "output_length": 4,
                                         "hash_ids": ids}) + "\n" for i, ids in enumerate(IDS)))
    return trace


def _hits(tmp_path, *extra) -> list[int]:
    out = tmp_path / ("run" + "-".join(extra))
    argv = ["simulate", "--trace", str(_trace(tmp_path)), "--format", "mooncake", "--set", "enable_prefix_caching=true",
            "--set", "block_size=16", *extra, "--out", str(out)]
    assert main(argv) == 0
    return pd.read_parquet(out / "requests.parquet")["prefix_hit_tokens"].fillna(0).astype(int).tolist()


def test_simulate_shares_the_blocks_of_the_given_hash_block_size(tmp_path, capsys):
    # 64 tokens per hash id: the later requests share their first 64 tokens (4 blocks of 16) with the first.
    assert _hits(tmp_path, "--hash-block-tokens", "64") == [0, 64, 64, 64]
    # Mooncake's 512 by default: a 200-token prompt lies inside hash id 1's block, so the prompts are the same
    # and a later request hits every full block but the last token's (192 of 200).
    assert _hits(tmp_path) == [0, 192, 192, 192]


@pytest.mark.parametrize("value", ["0", "-64"])
def test_a_bad_hash_block_size_is_one_line_exit_2(tmp_path, capsys, value):
    capsys.readouterr()
    argv = ["simulate", "--trace", str(_trace(tmp_path)), "--format", "mooncake", "--hash-block-tokens", value,
            "--out", str(tmp_path / "bad")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--hash-block-tokens" in err and value in err, err
