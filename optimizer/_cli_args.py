"""Argument types and argument groups that several ``kvtune`` subcommands share (``optimizer/cli.py`` and
``optimizer/report/cli.py`` both import them, so neither imports the other)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

__all__ = ["add_study_arguments", "finite_float", "non_negative_float", "non_negative_int", "port", "positive_float", "positive_int",
           "seed_int"]

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
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def seed_int(text: str) -> int:
    value = non_negative_int(text)
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be < 2**32, got {value}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]!r}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def port(text: str) -> int:
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
