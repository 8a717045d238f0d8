"""``kvtune workload fit|describe|generate``: look at a trace, fit synthetic traffic to it, generate from a spec.

The top-level CLI calls ``add_workload_parser(subparsers)``; each leaf parser sets ``handler`` (and ``func``) to a
function that takes the parsed arguments and returns the exit code. KvtuneError propagates to the top level,
which prints it as one line.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sim.errors import ConfigError
from sim.outputs import atomic_write_text, probe_out_dir

if TYPE_CHECKING:
    from sim.workload._spec import WorkloadSpec

__all__ = ["SEED_LIMIT", "add_format_argument", "add_seed_argument", "add_workload_parser", "seed_int"]

# The readers (pandas, numpy, YAML) are imported by the handlers, so that building the CLI stays cheap.


def add_format_argument(p: argparse.ArgumentParser) -> None:
    """``--format`` (dest ``fmt``, default None: detected) of every subcommand that reads a trace (this one's,
    ``kvtune simulate`` and ``kvtune replay``, through ``optimizer.add_format_argument``); the readers check it
    (``sim.workload._detect.check_format``)."""
    p.add_argument("--format", dest="fmt", default=None,
                   help="trace format: normalized, azure, burstgpt, mooncake, timed-jsonl, sharegpt, ... (default: detected)")


#: Seeds go to numpy's generators, which take 0 <= seed < 2**32.
SEED_LIMIT = 2**32


def seed_int(text: str) -> int:
    """argparse type: a seed, 0 <= seed < 2**32."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be < 2**32, got {value}")
    return value


def add_seed_argument(p: argparse.ArgumentParser, *, help: str, repeatable: bool = False,
                      default: int | None = 0) -> None:
    """``--seed`` (0 <= S < 2**32, :func:`seed_int`) of every subcommand that takes one (``workload generate``,
    ``kvtune simulate`` and ``kvtune replay`` through ``optimizer.add_seed_argument``): one seed (``default``: 0,
    or None where the caller has its own, as ``workload generate`` the spec's); or, ``repeatable``, a list (default
    None: the caller's default)."""
    if repeatable:
        p.add_argument("--seed", type=seed_int, action="append", default=None, help=help)
    else:
        p.add_argument("--seed", type=seed_int, default=default, help=help)


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", type=Path, help="trace file (CSV, CSV.GZ, parquet or JSONL)")
    add_format_argument(p)
    p.add_argument("--skip-bad-rows", action="store_true", help="skip malformed rows (counted) instead of failing")


def add_workload_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``workload`` and its subcommands on the top-level CLI's subparsers."""
    parser = subparsers.add_parser("workload", help="inspect traces, fit and generate synthetic workloads",
                                   description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="workload_command", metavar="{describe,fit,generate}")
    sub.required = True

    p = sub.add_parser("describe", help="count, span, rate, burstiness and length percentiles per class")
    _add_trace_args(p)
    p.set_defaults(func=cmd_describe, handler=cmd_describe)

    p = sub.add_parser("fit", help="fit per-class rate, burstiness CV and lengths; write a workload spec")
    _add_trace_args(p)
    p.add_argument("--out", type=Path, required=True, help="YAML workload spec to write")
    p.add_argument("--lengths", choices=("lognormal", "empirical"), default="lognormal",
                   help="lognormal through p50/p99 (default), or resample the trace's own (prompt, output) pairs")
    p.set_defaults(func=cmd_fit, handler=cmd_fit)

    p = sub.add_parser("generate", help="build the workload of a spec (or a study spec's workload:) as a trace")
    p.add_argument("spec", type=Path, help="YAML workload spec (e.g. from 'workload fit')")
    p.add_argument("--out", type=Path, required=True, help="trace to write (.csv, .csv.gz or .parquet)")
    add_seed_argument(p, help="seed (default: the spec's)", default=None)
    p.set_defaults(func=cmd_generate, handler=cmd_generate)
    return parser


def _fmt(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if float(value).is_integer() and abs(value) < 1e12:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _read(args: argparse.Namespace):
    from sim.workload._detect import check_format
    from sim.workload._loader import read_rows

    if args.fmt is not None:
        check_format(args.fmt, "--format")
    return read_rows(args.trace, args.fmt, skip_bad_rows=args.skip_bad_rows)


def cmd_describe(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import numpy as np

    from sim.workload._arrivals import ArrivalSpec
    from sim.workload._fit import describe
    from sim.workload._loader import from_rows

    out = out or sys.stdout
    parsed = _read(args)
    # A length-only trace is described without arrivals: a placeholder process, rate columns left blank.
    workload = from_rows(parsed, classes=None, seed=0,
                         arrival=None if parsed.timed else ArrivalSpec("poisson", 1.0))
    table = describe(workload)
    if not parsed.timed:
        table[["span_s", "rate_rps", "interarrival_cv"]] = np.nan
    print(f"{args.trace} ({parsed.report.fmt}): {len(workload)} requests"
          + ("" if parsed.timed else ", no arrival times (lengths only)"), file=out)
    shown = table.copy()
    for column in shown.columns[1:]:
        shown[column] = [_fmt(v) for v in shown[column]]
    print(shown.to_string(index=False), file=out)
    report = workload.report
    if report and (report.bad_rows_skipped or report.failed_requests or report.unmatched_rows):
        print(report.summary(), file=out)
    return 0


def _dump(spec: "WorkloadSpec", path: Path, header: str) -> None:
    import yaml

    text = yaml.safe_dump(spec.to_dict(), sort_keys=False, default_flow_style=None, width=120)
    atomic_write_text(path, header + text)


def cmd_fit(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from sim.workload._fit import fit_workload
    from sim.workload._lengths import Empirical
    from sim.workload._loader import from_rows
    from sim.workload._spec import WorkloadSpec

    out = out or sys.stdout
    probe_out_dir(Path(args.out).parent)  # before the fit: an output that cannot be written fails at once
    parsed = _read(args)
    if not parsed.timed:
        raise ConfigError("trace", f"{args.trace} has no arrival times: there is no rate or burstiness to fit")
    workload = from_rows(parsed, classes=None, arrival=None, seed=0)
    empirical = None
    if args.lengths == "empirical":
        empirical = Empirical(str(Path(args.trace).resolve()), parsed.report.fmt)
    try:
        generator = fit_workload(workload, empirical_from=empirical)
    except ValueError as exc:
        raise ConfigError("trace", str(exc)) from None
    spec = WorkloadSpec(generator=generator, seed=0)
    lengths = ("lognormal lengths through the\n# trace's p50 and p99, clipped to its min/max (means may differ)"
               if empirical is None else "(prompt, output) pairs\n# resampled from the trace's own class rows")
    header = (f"# kvtune workload spec fitted from {args.trace} ({parsed.report.fmt}, {len(workload)} requests).\n"
              f"# Per class: rate_rps, inter-arrival cv (gamma renewal; 1 = Poisson), {lengths}.\n"
              "# Add slo/timeout per class under classes:.\n")
    _dump(spec, args.out, header)
    for c in generator.classes:
        print(f"{c.name}: {c.rate_rps:.3f} req/s, cv {c.cv:.2f}", file=out)
    print(f"wrote {args.out}", file=out)
    return 0


def load_spec_file(path: Path) -> "WorkloadSpec":
    """A workload spec from YAML: the file itself, or its ``workload:`` section (a study spec)."""
    from sim.safe_yaml import read_yaml
    from sim.workload._spec import WorkloadSpec

    from sim.fields import file_error, in_file

    if not path.exists():
        raise file_error(path, "no such file")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise file_error(path, "must be a mapping (a workload spec)")
    try:
        return WorkloadSpec.from_dict(data["workload"] if "workload" in data else data, "workload",
                                      base_dir=path.resolve().parent)
    except ConfigError as exc:
        raise in_file(exc, path) from None


def cmd_generate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from sim.workload._writer import write_trace

    out = out or sys.stdout
    spec = load_spec_file(args.spec)
    probe_out_dir(Path(args.out).parent)
    workload = spec.build(args.seed)
    write_trace(workload, args.out)
    print(f"wrote {args.out}: {len(workload)} requests over {workload.span_s:.1f} s", file=out)
    if workload.report is not None and workload.report.summary().count(";"):
        print(workload.report.summary(), file=out)
    return 0
