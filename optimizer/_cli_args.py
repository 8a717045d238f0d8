"""Argument types and argument groups that several ``kvtune`` subcommands share (``optimizer/cli.py``,
``optimizer/cli_simulate.py``, ``optimizer/report/cli.py`` and the replay package's ``twin`` / ``replay`` /
``calibrate`` all import them, so none imports another; the public names are exported by ``optimizer``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

__all__ = ["add_engine_arguments", "add_study_arguments", "finite_float", "non_negative_float", "non_negative_int",
           "parse_pairs", "port", "positive_float", "positive_int", "seed_int"]

#: Seeds go to numpy's generators, which take 0 <= seed < 2**32.
SEED_LIMIT = 2**32


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _int_at_least(text, 0)


def seed_int(text: str) -> int:
    """argparse type: a seed, 0 <= seed < 2**32."""
    value = non_negative_int(text)
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be < 2**32, got {value}")
    return value


def finite_float(text: str) -> float:
    """argparse type: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def port(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: any free one)."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0-65535 (0: any free one), got {value}")
    return value


def add_study_arguments(p: argparse.ArgumentParser, out_help: str) -> None:
    """What ``export`` and ``report`` share: the spec, where its study is stored, the output folder, the pick."""
    p.add_argument("spec", type=Path, help="study spec (YAML)")
    p.add_argument("--storage", help="Optuna storage URL (default: the spec's storage, else sqlite:///<study out>/study.db)")
    p.add_argument("--study-out", type=Path, help="the out folder 'kvtune tune' used, to find its default storage")
    p.add_argument("--out", type=Path, required=True, help=out_help)
    p.add_argument("--favor", metavar="CLASS", help="pick the Pareto point best for this class's SLO "
                                                    "(default: highest throughput meeting every SLO)")


def add_engine_arguments(p: argparse.ArgumentParser, *, model_help: str, gpu_help: str,
                         set_help: str = "engine knob (repeatable)", required: bool = False) -> None:
    """The engine a subcommand runs: ``--model`` (profile name or HF folder), ``--gpu`` (device profile name or
    YAML) and ``--set KNOB=VALUE`` (repeatable; read with :func:`parse_pairs`); ``required``: --model and --gpu."""
    p.add_argument("--model", required=required, default=None, help=model_help)
    p.add_argument("--gpu", required=required, default=None, help=gpu_help)
    p.add_argument("--set", action="append", metavar="KNOB=VALUE", help=set_help)


def parse_pairs(items: list[str] | None, what: str = "--set") -> dict[str, str]:
    """Repeated ``NAME=VALUE`` arguments (``--set``, ``--coef``, ...) as a dict; a malformed one is a ConfigError
    naming the option ``what``."""
    from sim.errors import ConfigError

    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(what, f"expected NAME=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out
