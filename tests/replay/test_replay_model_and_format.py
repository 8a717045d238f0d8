"""``kvtune replay --url`` requests ``--model`` and refuses a server that does not serve it; ``--format`` names
a trace's format where detection cannot (issue 32)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from optimizer.cli import main
from replay_test_helpers import MODEL, running_twin

SERVED = "meta-llama/Meta-Llama-3-8B"


@pytest.fixture(scope="module")
def renamed_twin(tmp_path_factory):
    """A twin of MODEL that serves it under another name (vllm serve --served-model-name)."""
    with running_twin({"max_model_len": 4096}, speed=20.0, served_model_name=SERVED,
                      tmp_path=tmp_path_factory.mktemp("twin")) as url:
        yield url


def test_a_server_that_does_not_serve_the_model_is_refused_in_one_line(renamed_twin, tmp_path, capsys):
    rc = main(["replay", "--url", renamed_twin, "--model", MODEL, "--head", "2", "--speed", "20",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert "--model" in err and repr(MODEL) in err and repr(SERVED) in err and "--served-model-name" in err
    assert not list(tmp_path.glob("trial-*"))  # refused before anything ran


def test_the_replay_requests_the_named_model(renamed_twin, tmp_path, capsys):
    rc = main(["replay", "--url", renamed_twin, "--model", SERVED, "--head", "3", "--rate-scale", "20",
               "--speed", "20", "--out", str(tmp_path), "--sample-interval", "0.1"])
    assert rc == 0, capsys.readouterr().err
    (run,) = tmp_path.glob("trial-*/seed-0")
    meta = json.loads((run / "replay.json").read_text())
    assert meta["info"]["model"] == SERVED and meta["engine"]["model"] == SERVED


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_format_names_a_mooncake_trace_whose_name_does_not(shared_twin, tmp_path, capsys):
    # Mooncake's keys, but no hash_ids: neither the name nor the content says Mooncake (ms) or timed-jsonl (s).
    trace = _jsonl(tmp_path / "trace.jsonl", [{"timestamp": t, "input_length": 64, "output_length": 4}
                                              for t in (0, 500, 1000, 1500)])
    args = ["replay", "--url", shared_twin, "--model", MODEL, "--trace", str(trace), "--speed", "20",
            "--sample-interval", "0.1"]
    assert main([*args, "--out", str(tmp_path / "detected")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ambiguous" in err and "mooncake" in err, err
    assert main([*args, "--format", "no-such-format", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--format" in err and "no-such-format" in err, err
    for fmt, spacing_s in (("mooncake", 0.5), ("timed-jsonl", 500.0)):
        out = tmp_path / fmt
        head = ["--head", "2"] if fmt == "timed-jsonl" else []  # 500 s apart: two requests, sped up by --rate-scale
        scale = ["--rate-scale", "1000"] if fmt == "timed-jsonl" else []
        assert main([*args, "--format", fmt, *head, *scale, "--out", str(out)]) == 0, capsys.readouterr().err
        (run,) = out.glob("trial-*/seed-0")
        requests = pd.read_parquet(run / "requests.parquet").sort_values("arrival_s")
        assert (requests["status"] == "finished").all()
        gaps = requests["arrival_s"].diff().dropna().to_numpy()
        assert gaps == pytest.approx([spacing_s / (1000.0 if scale else 1.0)] * len(gaps))
