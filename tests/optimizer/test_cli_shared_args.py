"""The arguments several kvtune subcommands share are defined once (optimizer/_cli_args.py): every subcommand
that takes one parses it with the same type, default, choices and help, and rejects the same bad values."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from optimizer.cli import build_parser, main


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[prefix + name] = sub
                out.update(_subcommands(sub, prefix + name + " "))
    return out


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


#: flag -> the subcommands that take it, each parsing it the same way (help included).
SHARED = {
    "--format": ["simulate", "replay", "workload describe", "workload fit"],
    "--rate-scale": ["simulate", "replay"],
    "--hash-block-tokens": ["simulate", "replay"],
    "--coef": ["twin", "replay"],
    "--vllm-python": ["replay", "calibrate"],
    "--vllm-arg": ["replay", "calibrate"],
    "--log-level": ["twin", "replay"],
}
#: flag -> subcommands whose help may differ (it says what the flag is for there), all else the same.
SHARED_BUT_HELP = {
    "--model": ["simulate", "twin", "replay", "calibrate"],
    "--gpu": ["simulate", "twin", "replay", "calibrate"],
    "--set": ["simulate", "twin", "replay", "calibrate"],
    "--profile": ["simulate", "twin", "replay"],
}


def _signature(action: argparse.Action, with_help: bool) -> tuple:
    return (type(action).__name__, action.dest, action.type, action.default, action.choices, action.metavar,
            action.nargs, action.help if with_help else None)


@pytest.mark.parametrize("flag", sorted({**SHARED, **SHARED_BUT_HELP}))
def test_a_shared_argument_parses_the_same_everywhere(flag):
    subs = _subcommands(build_parser())
    names = SHARED.get(flag) or SHARED_BUT_HELP[flag]
    actions = {name: _option(subs[name], flag) for name in names}
    assert all(actions.values()), {n: a for n, a in actions.items() if a is None}
    signatures = {_signature(a, flag in SHARED) for a in actions.values()}
    assert len(signatures) == 1, signatures


def test_seed_is_checked_the_same_in_simulate_and_replay():
    subs = _subcommands(build_parser())
    simulate, replay = _option(subs["simulate"], "--seed"), _option(subs["replay"], "--seed")
    generate = _option(subs["workload generate"], "--seed")
    assert simulate.type is replay.type is generate.type  # seed_int: 0 <= S < 2**32
    assert simulate.default == 0 and isinstance(replay, argparse._AppendAction) and replay.default is None
    assert generate.default is None  # the spec's seed


@pytest.mark.parametrize("argv, message", [
    (["replay", "--url", "http://127.0.0.1:1", "--model", "m", "--out", "o", "--seed", "x"], "--seed"),
    (["replay", "--url", "http://127.0.0.1:1", "--model", "m", "--out", "o", "--seed", "-1"], "--seed"),
    (["twin", "--model", "Llama-3-8B", "--gpu", "H100", "--log-level", "loud"], "--log-level"),
    (["simulate", "--rate-scale", "0"], "--rate-scale"),
    (["workload", "generate", "spec.yaml", "--out", "t.csv", "--seed", str(2**32)], "--seed"),
    (["replay", "--url", "http://127.0.0.1:1", "--model", "m", "--out", "o", "--rate-scale", "nan"], "--rate-scale"),
])
def test_a_bad_shared_argument_is_one_line_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("kvtune: error:")


def test_log_level_takes_any_case():
    args = build_parser().parse_args(["twin", "--model", "m", "--gpu", "g", "--log-level", "DEBUG"])
    assert args.log_level == "debug"


# ---- defined once in the source: no subcommand or benchmark adds a shared flag itself -------------------------------
ROOT = Path(__file__).resolve().parents[2]
HOME = "optimizer/_cli_args.py"
#: Shared flags whose home is the lowest layer that reads them (optimizer re-exports their add_*_argument).
LOWER_HOME = {"--format": "sim/workload/cli.py", "--seed": "sim/workload/cli.py"}
#: A definition outside HOME on purpose, with its reason.
OWN_FLAG = {
    ("optimizer/cli.py", "--storage"): "tune's storage defaults to its own --out, not a study's",
    ("benchmarks/summarize_speed.py", "--profile"): "a cProfile switch, not a latency profile",
    ("benchmarks/fleet_vs_dynamo.py", "--seed"): "the script also runs in Dynamo's environment, without kvtune",
}


def _flags_added(path: Path) -> list[tuple[str, int]]:
    return [(node.args[0].value, node.lineno)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--")]


def test_shared_flags_are_added_only_by_their_home():
    shared = {flag for flag, _ in _flags_added(ROOT / HOME)} - {"--out"}
    for flag, home in LOWER_HOME.items():
        assert [line for added, line in _flags_added(ROOT / home) if added == flag] and flag not in shared, flag
        shared.add(flag)
    assert {"--model", "--gpu", "--set", "--seed", "--rate-scale", "--format"} <= shared
    found = []
    for package in ("sim", "objectives", "optimizer", "replay", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == HOME:
                continue
            found += [f"{rel}:{line}: {flag}" for flag, line in _flags_added(path)
                      if flag in shared and (rel, flag) not in OWN_FLAG and LOWER_HOME.get(flag) != rel]
    assert not found, "a shared flag defined again (use optimizer's add_*_argument):\n" + "\n".join(found)
