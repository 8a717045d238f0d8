"""Argument types and the arguments that several ``kvtune`` subcommands share, each defined once here
(``optimizer/cli.py``, ``optimizer/cli_simulate.py``, ``optimizer/report/cli.py`` and the replay package's
``twin`` / ``replay`` / ``calibrate`` all import them, so none imports another; the public names are exported by
``optimizer``).  ``--format`` and ``--seed`` are defined by ``kvtune workload`` (``sim.workload.cli``'s
``add_format_argument`` and ``add_seed_argument``), the lowest layer that reads them, and re-exported here.

Which subcommands take which:

- ``--model --gpu --set``: :func:`add_engine_arguments` (simulate, twin, replay, calibrate; ``--model`` alone:
  :func:`add_model_argument`);
- ``--format``: :func:`add_format_argument` (simulate, replay, workload describe / fit);
- ``--profile --coef``: :func:`add_latency_arguments` (simulate without --coef, twin, replay);
- ``--seed``: :func:`add_seed_argument` (simulate; replay, repeatable; workload generate, default the spec's);
- ``--rate-scale``: :func:`add_rate_scale_argument` (simulate, replay);
- ``--hash-block-tokens``: :func:`add_hash_block_tokens_argument` (simulate, replay; applied with
  :func:`apply_hash_block_tokens`);
- ``--vllm-python --vllm-arg``: :func:`add_vllm_arguments` (replay, calibrate);
- ``--log-level``: :func:`add_log_level_argument` (twin, replay);
- ``SPEC --storage --study-out --out --favor``: :func:`add_study_arguments` (export, report).

The benchmarks (``benchmarks/*.py``) take these flags from here too, through ``optimizer``'s public names
(``tests/test_public_seams.py`` finds a second definition).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from sim.workload.cli import SEED_LIMIT, add_format_argument, add_seed_argument, seed_int  # noqa: F401

__all__ = ["add_engine_arguments", "add_format_argument", "add_hash_block_tokens_argument", "add_latency_arguments",
           "add_log_level_argument", "add_model_argument", "add_rate_scale_argument", "add_seed_argument", "add_study_arguments",
           "add_vllm_arguments", "apply_hash_block_tokens", "finite_float", "non_negative_float", "non_negative_int",
           "parse_pairs", "port", "positive_float", "positive_int", "seed_int"]

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
                         set_help: str = "engine knob (repeatable)", required: bool = False,
                         knobs: bool = True) -> None:
    """The engine a subcommand runs: ``--model`` (profile name or HF folder), ``--gpu`` (device profile name or
    YAML) and, with ``knobs``, ``--set KNOB=VALUE`` (repeatable; read with :func:`parse_pairs`); ``required``:
    --model and --gpu.  A script with defaults of its own sets them with ``p.set_defaults(model=...)``."""
    add_model_argument(p, help=model_help, required=required)
    p.add_argument("--gpu", required=required, default=None, help=gpu_help)
    if knobs:
        p.add_argument("--set", action="append", metavar="KNOB=VALUE", help=set_help)


def add_model_argument(p: argparse.ArgumentParser, *, help: str, required: bool = False) -> None:
    """``--model`` alone (profile name or HF folder), for a script whose device comes from elsewhere (its latency
    profile); :func:`add_engine_arguments` adds it with ``--gpu``."""
    p.add_argument("--model", required=required, default=None, help=help)


#: ``--profile``'s help where the subcommand says nothing more.
LATENCY_PROFILE_HELP = "latency profile YAML written by kvtune calibrate"


def add_latency_arguments(p: argparse.ArgumentParser, *, profile_help: str = LATENCY_PROFILE_HELP,
                          coef: bool = True, required: bool = False) -> None:
    """The latency model's coefficients: ``--profile`` (a profile YAML written by ``kvtune calibrate``;
    ``required``: it must be given) and, with ``coef``, ``--coef NAME=VALUE`` overrides (repeatable; read with
    :func:`parse_pairs`)."""
    p.add_argument("--profile", required=required, default=None, help=profile_help)
    if coef:
        p.add_argument("--coef", action="append", metavar="NAME=VALUE",
                       help="latency coefficient override, e.g. overhead_s=0.004 (repeatable)")


def add_rate_scale_argument(p: argparse.ArgumentParser, *, default: float = 1.0,
                            help: str = "compress arrival times X-fold (2 doubles the request rate)") -> None:
    """``--rate-scale X`` (> 0, default 1; a benchmark may start from another): the trace's arrivals compressed
    X-fold."""
    p.add_argument("--rate-scale", type=positive_float, default=default, help=help)


#: ``--hash-block-tokens``'s help (simulate and replay: the same trace must share the same blocks in both).
HASH_BLOCK_TOKENS_HELP = ("prompt tokens per hash_ids entry of a shared-prefix trace (default: the trace's, "
                          "Mooncake's 512); scale it with the trace's lengths, as a study spec's "
                          "workload.hash_block_tokens")


def add_hash_block_tokens_argument(p: argparse.ArgumentParser) -> None:
    """``--hash-block-tokens N``: the prompt tokens each ``hash_ids`` entry of a shared-prefix trace stands for
    (default None: the trace's own); checked and applied by :func:`apply_hash_block_tokens`."""
    p.add_argument("--hash-block-tokens", type=int, default=None, metavar="N", help=HASH_BLOCK_TOKENS_HELP)


def apply_hash_block_tokens(workload, value: int | None):
    """``workload`` with ``--hash-block-tokens`` applied (itself when the flag was not given); a value outside
    [1, 10**8] is a ConfigError naming the flag."""
    if value is None:
        return workload
    from sim.workload.workload import check_hash_block_tokens

    return workload.with_hash_block_tokens(check_hash_block_tokens(value, "--hash-block-tokens"))


def add_vllm_arguments(p: argparse.ArgumentParser, *, extra_args: bool = True) -> None:
    """The vLLM a subcommand launches: ``--vllm-python`` (its environment) and, with ``extra_args``,
    ``--vllm-arg`` (repeatable)."""
    p.add_argument("--vllm-python", default=None,
                   help="python of the environment where vLLM is installed (or the venv folder); default "
                        "$KVTUNE_VLLM_PYTHON.  The engine runs as PYTHON -m vllm.entrypoints.openai.api_server "
                        "with the flags of the release installed there")
    if extra_args:
        p.add_argument("--vllm-arg", action="append", metavar="ARG", help="extra argument for vllm serve (repeatable)")


#: ``--log-level``'s values (Python logging's level names).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def add_log_level_argument(p: argparse.ArgumentParser) -> None:
    """``--log-level`` of a long-running subcommand's Python logging (default warning)."""
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="warning",
                   help="Python logging level (default warning)")


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
