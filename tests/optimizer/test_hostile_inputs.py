"""Hostile or broken specs, traces and flags: each ends in one error line naming what is wrong, and exit code 2 --
never a traceback, never a silent fix, never gigabytes of memory (issue 13's list, one case each)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from optimizer_test_helpers import spec_dict

from optimizer.cli import main

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f'{chr(98 + i)}: &{chr(98 + i)} [' + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
) + "name: x\nworkload: {trace: bundled}\nmodel: Llama-2-7B\ngpu: L40S\nsearch: {base: none, max_num_seqs: *i}\n"


def _spec(**changes):
    d = copy.deepcopy(spec_dict())
    d["workload"]["max_requests"] = 30
    for path, value in changes.items():
        target = d
        keys = path.split("__")
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value
    return yaml.safe_dump(d)


SPECS = {
    "alias bomb": (BOMB, "aliases (*name) are not allowed"),
    "binary": (b"\x00\x01\xff\xfe name: x\n", "not UTF-8 text"),
    "nested 3000 deep": ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper than 64 levels"),
    "nan bound": (_spec(search={"base": "none", "max_num_seqs": {"low": float("nan"), "high": 64}}),
                  "search.max_num_seqs.low: must be a whole number, got nan"),
    "inf bound": (_spec(search={"base": "none", "max_num_seqs": {"low": 8, "high": float("inf")}}),
                  "search.max_num_seqs.high: must be a whole number, got inf"),
    "seed 2**32": (_spec(sampler={"name": "tpe", "seed": 2**32}), "sampler.seed: must be <= 4294967295"),
    "timeout 1e308": (_spec(budget__trial_timeout_s=1e308), "budget.trial_timeout_s: must be a positive number"),
    "absolute name": (_spec(name="/any/path"), "name: must be letters, digits"),
    "relative name": (_spec(name="../../x"), "name: must be letters, digits"),
    "objective on an empty class": (
        _spec(objectives=["p99_e2e_s:ghost"], workload__classes={
            "conv": {}, "ghost": {"match": {"prompt_tokens": {"min": 10**9}}}}),
        "objectives[0]: 'p99_e2e_s:ghost' names class 'ghost', which no request"),
    "SLO on an empty class": (
        _spec(workload__classes={"conv": {"slo": {"e2e_p99_s": 40}},
                                 "ghost": {"match": {"prompt_tokens": {"min": 10**9}}, "slo": {"e2e_p99_s": 1}}}),
        "workload.classes.ghost.slo: class 'ghost' has an SLO but no request"),
}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("kvtune: error: ") and len(lines[0]) <= 1100
    return lines[0]


@pytest.mark.parametrize("case", list(SPECS))
def test_hostile_specs(tmp_path, capsys, case):
    text, message = SPECS[case]
    path = tmp_path / "spec.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code = main(["tune", str(path), "--in-process", "--storage", "memory", "--no-export", "--trials", "1",
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert message in _one_error_line(capsys)


TRACES = {
    "huge token count": ("t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,99999999999999999999999\n1,5,5\n",
                         "t.csv:2: output_tokens=99999999999999999999999 is out of range"),
    "1e12 output tokens": ("t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,1e12\n1,5,5\n",
                           "t.csv:2: output_tokens=1e12 is out of range"),
    "unterminated quote": ("t.csv", 'arrival_s,prompt_tokens,output_tokens\n0,10,20\n"0.5,20,30\n1,2,3\n',
                           "cannot parse CSV row"),
    "hash_ids 1e400": ("t.jsonl", json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5})[:-1]
                       + ', "hash_ids": [1e400]}\n', "t.jsonl:1: hash_ids=[inf] is not a list of 64-bit integers"),
}


@pytest.mark.parametrize("case", list(TRACES))
def test_hostile_traces(tmp_path, capsys, case):
    name, text, message = TRACES[case]
    path = tmp_path / name
    path.write_text(text)
    argv = ["simulate", "--trace", str(path), "--model", "Llama-2-7B", "--gpu", "L40S", "--out", str(tmp_path / "o")]
    if name.endswith(".jsonl"):
        argv += ["--format", "mooncake"]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert message.replace("1e12", "1000000000000.0") in line or message in line, line
    assert not (tmp_path / "o" / "requests.parquet").exists()


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--seed", "-1"], "--seed: must be >= 0"),
    (["simulate", "--rate-scale", "inf"], "--rate-scale: must be a finite number"),
    (["twin", "--model", "Llama-3-8B", "--gpu", "A100-80GB", "--port", "99999"], "--port: must be a TCP port"),
    (["replay", "--url", "http://127.0.0.1:9", "--model", "m", "--out", "x", "--rate-scale", "inf"],
     "--rate-scale: must be a finite number"),
])
def test_hostile_flags(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in _one_error_line(capsys)


def test_unwritable_out_folders_fail_before_the_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = str(blocker / "out")
    assert main(["simulate", "--max-requests", "5", "--out", bad]) == 2
    assert f"--out: cannot write to {bad}" in _one_error_line(capsys)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,20\n1,5,5\n2,5,5\n")
    assert main(["workload", "fit", str(trace), "--out", str(blocker / "spec.yaml")]) == 2
    assert "cannot write to" in _one_error_line(capsys)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(spec_dict()))
    for command in ("export", "report"):
        assert main([command, str(spec), "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--out", bad]) == 2
        assert f"--out: cannot write to {bad}" in _one_error_line(capsys)
