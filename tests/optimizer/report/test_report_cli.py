"""``kvtune report`` as a command: the parser that ``add_report_parser`` adds, its output and its errors."""

from __future__ import annotations

import argparse
import json

import yaml
from report_test_helpers import report_spec_dict

from optimizer.cli import main
from optimizer.report.cli import add_report_parser


def _spec_file(tmp_path):
    path = tmp_path / "report-mini.yaml"
    path.write_text(yaml.safe_dump(report_spec_dict(), sort_keys=False))
    return path


def test_add_report_parser_wires_a_subcommand(tmp_path):
    parser = argparse.ArgumentParser(prog="kvtune")
    sub = parser.add_subparsers(dest="command")
    add_report_parser(sub)
    args = parser.parse_args(["report", "s.yaml", "--out", str(tmp_path), "--whatif", "gpu=H200",
                              "--whatif", "kv_cache_dtype=fp8", "--sweep", "max_num_seqs=64,128", "--favor", "chat"])
    assert args.command == "report" and callable(args.handler)
    assert args.whatif == ["gpu=H200", "kv_cache_dtype=fp8"] and args.sweep == ["max_num_seqs=64,128"]
    assert args.whatif_trials == "picked" and args.favor == "chat" and not args.no_png


def test_report_command_writes_the_page(tuned_study, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["report", str(_spec_file(tmp_path)), "--storage", tuned_study["storage"], "--out", str(out),
                 "--no-png", "--favor", "chat"])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'report.html'}" in printed and "class chat: p99 E2E" in printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["pick"]["rule"].startswith("favor class chat")


def test_report_command_errors_are_one_line(tmp_path, capsys):
    code = main(["report", str(_spec_file(tmp_path)), "--study-out", str(tmp_path / "never-tuned"),
                 "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvtune: error: storage:") and "run 'kvtune tune' first" in err and "\n" not in err
    code = main(["report", str(_spec_file(tmp_path)), "--out", str(tmp_path / "r"), "--whatif", "gpu=B300"])
    assert code == 2 and "unknown GPU" in capsys.readouterr().err


def test_a_whatif_or_sweep_that_cannot_start_is_refused_in_one_line(tuned_study, tmp_path, capsys):
    """Issue 30: the study's start-up check (optimizer._capacity.startup_problem) refuses a what-if or sweep value
    that cannot start on its device: one line naming the argument and the reason, exit 2; one that can start runs."""
    spec, storage = str(_spec_file(tmp_path)), tuned_study["storage"]
    code = main(["report", spec, "--storage", storage, "--out", str(tmp_path / "r1"), "--no-png",
                 "--whatif", "gh: gpu=GH200,tensor_parallel_size=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and not (tmp_path / "r1" / "report.html").exists()
    assert err.startswith("kvtune: error: --whatif: gh: cannot start:") and "(1: its gpus_per_node)" in err
    code = main(["report", spec, "--storage", storage, "--out", str(tmp_path / "r2"), "--no-png",
                 "--sweep", "num_gpu_blocks_override=1200,2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("kvtune: error: --sweep: num_gpu_blocks_override=2: cannot start:")
    assert "one max-length request needs" in err
    out = tmp_path / "r3"
    code = main(["report", spec, "--storage", storage, "--out", str(out), "--no-png", "--whatif", "gh: gpu=GH200"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "report.json").read_text())
    (whatif,) = doc["whatifs"]
    assert whatif["whatif"] == "gh" and whatif["runs"] and all(not r.get("error") for r in whatif["runs"])
