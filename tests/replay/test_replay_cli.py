"""The replay package's subcommands: registered on any argparse parser, runnable standalone."""

from __future__ import annotations

import argparse
import json

import pandas as pd

from optimizer.cli import main
from replay.cli import add_replay_parsers, cmd_calibrate, cmd_replay, cmd_twin
from replay_test_helpers import MODEL


def test_subcommands_register_on_a_host_parser():
    parser = argparse.ArgumentParser(prog="kvtune")
    sub = parser.add_subparsers(dest="command")
    add_replay_parsers(sub)
    args = parser.parse_args(["twin", "--model", "Llama-3-8B", "--gpu", "H100", "--set", "max_num_seqs=64",
                              "--port", "0", "--speed", "30"])
    assert args.func is cmd_twin and args.set == ["max_num_seqs=64"] and args.speed == 30.0
    args = parser.parse_args(["calibrate", "a", "b", "--out", "p.yaml"])
    assert args.func is cmd_calibrate and args.results == ["a", "b"]
    args = parser.parse_args(["replay", "--url", "http://127.0.0.1:1", "--model", "m", "--out", "o"])
    assert args.func is cmd_replay


def test_replay_against_a_running_server(shared_twin, tmp_path, capsys):
    rc = main(["replay", "--url", shared_twin, "--model", MODEL, "--head", "12", "--rate-scale", "20",
               "--speed", "20", "--timeout", "conv=30", "--out", str(tmp_path), "--sample-interval", "0.1"])
    assert rc == 0
    assert "12 requests" in capsys.readouterr().out
    (run,) = tmp_path.glob("trial-*/seed-0")
    requests = pd.read_parquet(run / "requests.parquet")
    assert len(requests) == 12 and (requests["status"] == "finished").all()
    meta = json.loads((run / "replay.json").read_text())
    assert meta["engine"]["kind"] == "external" and meta["classes"]["conv"]["timeout_s"] == 30.0


def test_user_errors_exit_2(capsys):
    assert main(["twin", "--model", "no-such-model", "--gpu", "H100"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["replay", "--launch", "twin", "--model", MODEL, "--out", "x", "--set", "max_num_seq=3"]) == 2
    assert "did you mean 'max_num_seqs'" in capsys.readouterr().err
    assert main(["replay", "--launch", "twin", "--model", MODEL, "--out", "x", "--head", "1"]) == 2
    assert "gpu profile" in capsys.readouterr().err
