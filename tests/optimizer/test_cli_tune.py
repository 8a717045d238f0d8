"""The kvtune command line: tune, export, one-line errors (exit 2), interrupts (exit 130)."""

from __future__ import annotations

import json

import pytest
import yaml
from optimizer_test_helpers import spec_dict, write_spec

import optimizer._study
from optimizer.cli import build_parser, main


@pytest.fixture
def small_spec(tmp_path):
    d = spec_dict(budget={"trials": 4})
    d["workload"]["max_requests"] = 150
    return write_spec(tmp_path, d)


def test_tune_then_export(tmp_path, small_spec, capsys):
    out = tmp_path / "run"
    code = main(["tune", str(small_spec), "--in-process", "--out", str(out)])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    assert "study conv-l40s: 4/4 trials finished" in captured.out
    assert "trials 4/4 done" in captured.err
    for name in ("study.db", "pareto.csv", "recommended.yaml", "recommended.json"):
        assert (out / name).exists(), name
    # More trials in the same storage: resumes.
    assert main(["tune", str(small_spec), "--in-process", "--out", str(out), "--trials", "6", "--no-export"]) == 0
    assert "6/6 trials finished" in capsys.readouterr().out

    exp = tmp_path / "exp"
    code = main(["export", str(small_spec), "--study-out", str(out), "--out", str(exp), "--favor", "conv"])
    captured = capsys.readouterr()
    doc = json.loads((exp / "recommended.json").read_text())
    assert doc["pick"]["favor"] == "conv"
    assert code == (0 if doc["feasible"] else 1)
    assert f"recommended trial {doc['trial']}" in captured.out
    flags = yaml.safe_load((exp / "recommended.yaml").read_text())
    assert "max-num-seqs" in flags


@pytest.mark.parametrize(
    ("argv_tail", "changes", "expect"),
    [
        ([], {"budget": {"trials": 0}}, "kvtune: error: budget.trials: must be >= 1"),
        ([], {"engine": {"swap_space_gb": 4}}, "kvtune: error: engine.swap_space_gb: is not a knob of vllm-v1"),
        (["--in-process", "--storage", "foo://bar"], {}, "kvtune: error: storage: cannot open foo://bar"),
        (["--in-process", "--storage", "sqlite:////proc/kvtune-test/y.db"], {}, "kvtune: error: storage: cannot"),
    ],
)
def test_errors_are_one_line_exit_2(tmp_path, capsys, argv_tail, changes, expect):
    path = write_spec(tmp_path, spec_dict(**changes))
    code = main(["tune", str(path), *argv_tail])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("kvtune: error:")]
    assert len(lines) == 1 and lines[0].startswith(expect), err


def test_export_without_a_study(tmp_path, small_spec, capsys):
    assert main(["export", str(small_spec), "--study-out", str(tmp_path / "none"), "--out", str(tmp_path / "e")]) == 2
    assert "does not exist; run 'kvtune tune' first" in capsys.readouterr().err


def test_interrupt_exits_130(tmp_path, small_spec, capsys, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizer._study.Tuner, "run", interrupted)
    assert main(["tune", str(small_spec), "--in-process"]) == 130
    assert "interrupted; run the same command again to resume" in capsys.readouterr().err


def test_subcommands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"tune", "export"} <= set(sub.choices)
    # The lead's and the workload engineer's subcommands are picked up when their modules are there.
    for name, module in (("simulate", "optimizer.cli_simulate"), ("workload", "sim.workload.cli")):
        try:
            __import__(module)
        except ImportError:
            continue
        assert name in sub.choices
    with pytest.raises(SystemExit) as info:
        main(["tune"])
    assert info.value.code == 2
