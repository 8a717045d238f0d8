import argparse

import pandas as pd
import pytest
import yaml

from sim.errors import ConfigError, TraceError
from sim.workload import bundled_trace_path, describe, load_trace
from optimizer.cli import main
from sim.workload.cli import add_workload_parser


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="kvtune")
    add_workload_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.handler is args.func
    rc = args.handler(args)
    return rc, capsys.readouterr().out


def test_describe_prints_per_class_table(capsys, data_dir):
    rc, out = run(["workload", "describe", str(data_dir / "BurstGPT_sample.csv")], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert "(burstgpt): 12 requests" in lines[0]
    header = lines[1].split()
    assert header[:5] == ["class", "requests", "span_s", "rate_rps", "interarrival_cv"]
    assert {"prompt_p50", "prompt_p90", "prompt_p99", "output_p50", "output_p90", "output_p99"} <= set(header)
    assert [line.split()[0] for line in lines[2:5]] == ["default", "failed", "all"]
    assert "3 failed requests kept" in out


def test_describe_length_only_file(capsys, data_dir):
    rc, out = run(["workload", "describe", str(data_dir / "sharegpt_lengths_head.csv")], capsys)
    assert rc == 0 and "no arrival times" in out
    row = out.splitlines()[2].split()
    assert row[:5] == ["default", "30", "-", "-", "-"]


def test_describe_with_named_format(capsys, data_dir):
    rc, out = run(["workload", "describe", str(data_dir / "timed_trace_sample.jsonl"), "--format", "timed-jsonl"],
                  capsys)
    assert rc == 0 and "4 requests" in out


def test_fit_then_generate_round_trip(tmp_path, capsys):
    spec_path = tmp_path / "spec.yaml"
    rc, out = run(["workload", "fit", str(bundled_trace_path()), "--out", str(spec_path)], capsys)
    assert rc == 0 and "conv: 5.530 req/s" in out
    spec = yaml.safe_load(spec_path.read_text())
    conv = spec["generator"]["classes"]["conv"]
    assert conv["prompt_tokens"]["dist"] == "lognormal" and conv["cv"] == pytest.approx(1.09, abs=0.01)
    trace_path = tmp_path / "gen.csv"
    rc, out = run(["workload", "generate", str(spec_path), "--out", str(trace_path)], capsys)
    assert rc == 0 and "wrote" in out
    generated = load_trace(trace_path)
    want, got = describe(load_trace(bundled_trace_path())).iloc[0], describe(generated).iloc[0]
    assert got["rate_rps"] == pytest.approx(want["rate_rps"], rel=0.05)
    for column in ("prompt_p50", "prompt_p99", "output_p50", "output_p99"):
        assert got[column] == pytest.approx(want[column], rel=0.10)
    assert set(generated.classes) == {"conv"}


def test_generate_from_study_spec_with_relative_trace_and_parquet(tmp_path, capsys, data_dir):
    (tmp_path / "t.csv").write_bytes((data_dir / "azure_conv_2023_head.normalized.csv").read_bytes())
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "x", "workload": {"trace": "t.csv", "rate_scale": 2}}))
    out_path = tmp_path / "out.parquet"
    rc, _ = run(["workload", "generate", str(study), "--out", str(out_path)], capsys)
    assert rc == 0
    df = pd.read_parquet(out_path)
    assert len(df) == 40 and df["arrival_s"].iloc[-1] == pytest.approx(24.146296 / 2)


def test_generate_writes_hash_ids_back_readably(tmp_path, capsys, data_dir):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"trace": str(data_dir / "mooncake_trace_sample.jsonl"), "format": "mooncake"}))
    out_path = tmp_path / "o.csv"
    run(["workload", "generate", str(spec), "--out", str(out_path)], capsys)
    assert load_trace(out_path).requests["hash_ids"].tolist()[1] == [46, 47]


def test_errors_propagate_as_kvtune_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,-1,1\n")
    with pytest.raises(TraceError, match="bad.csv:3"):
        run(["workload", "describe", str(bad)], capsys)
    spec = tmp_path / "s.yaml"
    spec.write_text("trace: t.csv\nrate_scal: 2\n")
    with pytest.raises(ConfigError, match="workload.rate_scal"):
        run(["workload", "generate", str(spec), "--out", str(tmp_path / "o.csv")], capsys)
    spec.write_text("trace: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        run(["workload", "generate", str(spec), "--out", str(tmp_path / "o.csv")], capsys)


def test_a_bad_workload_spec_field_is_one_line_naming_field_and_file(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("trace: bundled\narrival: {rate_rps: 0}\n")
    rc = main(["workload", "generate", str(spec), "--out", str(tmp_path / "o.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"workload.arrival.rate_rps: must be > 0, got 0.0 (in {spec})" in err


def test_kvtune_workload_prints_one_line_errors(tmp_path, capsys):
    rc = main(["workload", "describe", str(tmp_path / "missing.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "missing.csv: no such file" in err


def test_fit_with_empirical_lengths_keeps_means(tmp_path, capsys):
    spec_path = tmp_path / "spec.yaml"
    rc, _ = run(["workload", "fit", str(bundled_trace_path()), "--out", str(spec_path), "--lengths", "empirical"],
                capsys)
    assert rc == 0
    conv = yaml.safe_load(spec_path.read_text())["generator"]["classes"]["conv"]
    assert conv["lengths"] == {"dist": "empirical", "trace": str(bundled_trace_path().resolve()),
                               "format": "normalized", "class": "conv"}
    trace_path = tmp_path / "gen.csv"
    run(["workload", "generate", str(spec_path), "--out", str(trace_path)], capsys)
    want, got = describe(load_trace(bundled_trace_path())).iloc[0], describe(load_trace(trace_path)).iloc[0]
    for column in ("rate_rps", "prompt_mean", "output_mean", "output_p50", "output_p99"):
        assert got[column] == pytest.approx(want[column], rel=0.05), column
