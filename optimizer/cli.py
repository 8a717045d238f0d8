"""The ``kvtune`` command line.

    kvtune tune studies/NAME.yaml [--trials N] [--workers N] [--storage URL] [--address RAY_ADDRESS] [--out DIR]
    kvtune export studies/NAME.yaml [--storage URL] --out DIR [--favor CLASS]
    kvtune simulate ...        (optimizer/cli_simulate.py)
    kvtune workload ...        (sim/workload/cli.py)

Errors caused by input (a spec, a flag, a trace) print ``kvtune: error: <message>`` as one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from optimizer._cli_args import add_study_arguments, positive_float, positive_int
from sim.errors import KvtuneError


def add_tune_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune", help="run or resume a tuning study",
        description="Launch (or resume: run the same command again) a tuning study: Ray workers run simulated "
                    "trials while Optuna searches engine knobs against the spec's objectives and class SLOs. "
                    "Ends by exporting the Pareto front and a recommended config to the out folder.")
    p.add_argument("spec", type=Path, help="study spec (YAML)")
    p.add_argument("--trials", type=positive_int, help="finished trials the study should have (default: budget.trials)")
    p.add_argument("--workers", type=positive_int, help="trials at once (default: budget.workers, else one per CPU)")
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite:///<out>/study.db)")
    p.add_argument("--address", help="Ray cluster address (default: the spec's ray_address, else a local Ray)")
    p.add_argument("--out", type=Path, help="output folder (default: the spec's out, else runs/<name>)")
    p.add_argument("--trial-timeout", type=positive_float, metavar="SECONDS",
                   help="per-trial timeout (default: budget.trial_timeout_s)")
    p.add_argument("--executor", choices=("auto", "ray", "process", "in-process"), default=None,
                   help="where trials run (default: the spec's executor, else auto: worker processes for a small "
                        "study on this machine, Ray for a cluster address, a replay backend or a large study)")
    p.add_argument("--in-process", action="store_true", help="run trials one by one in this process "
                                                             "(--executor in-process)")
    p.add_argument("--no-export", action="store_true", help="do not export pareto.csv / recommended.* at the end")
    p.set_defaults(handler=cmd_tune)


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write the Pareto front and a recommended config of a study",
        description="Write pareto.csv, recommended.yaml (vllm serve --config for the spec's vllm_version) and "
                    "recommended.json (predicted per-class metrics next to the engine's default config).")
    add_study_arguments(p, "folder to write the export to")
    p.set_defaults(handler=cmd_export)


def cmd_tune(args: argparse.Namespace) -> int:
    import time

    from optimizer._export import export_study
    from optimizer._spec import load_study_spec
    from optimizer._study import Tuner

    from sim.outputs import probe_out_dir

    spec = load_study_spec(args.spec)
    kind = "in-process" if args.in_process else args.executor
    tuner = Tuner(spec, trials=args.trials, workers=args.workers, storage=args.storage, address=args.address,
                  out=args.out, trial_timeout_s=args.trial_timeout, executor_kind=kind)
    if not args.no_export:
        probe_out_dir(tuner.out)  # before the study: an export that cannot be written would waste it
    result = tuner.run()
    ran_on = f" on {result.executor}" if result.executor else ""
    print(f"study {result.name}: {result.finished}/{result.target} trials finished ({result.complete} complete, "
          f"{result.failed} failed, {result.feasible} feasible); ran {result.ran} now{ran_on} in "
          f"{result.wall_s:.1f} s ({result.split_text()}); storage {result.storage}")
    record = result.to_dict()
    if not args.no_export and result.complete and result.storage != "memory":
        t0 = time.monotonic()
        export = export_study(spec, storage=result.storage, out=tuner.out, context=tuner.ctx)
        record["export_s"] = round(time.monotonic() - t0, 3)
    else:
        export = None
    if result.storage != "memory" or args.out is not None:
        _write_run_record(tuner.out, record)
    if result.complete == 0 and result.finished:
        print("kvtune: error: no trial completed; each failed trial's reason is in its fail_reason attribute "
              "(optuna-dashboard or the study storage)", file=sys.stderr)
        return 1
    if export is None:
        return 0
    print(export.summary())
    return 0 if export.feasible else 1


def _write_run_record(out: Path, record: dict) -> None:
    """``<out>/study_run.json``: the last ``kvtune tune`` run's counts, executor and wall-time split (best effort:
    an out folder that cannot be written only loses this file)."""
    import json

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "study_run.json").write_text(json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        print(f"kvtune: warning: cannot write {out / 'study_run.json'}: {exc.strerror or exc}", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    from optimizer._export import export_study
    from optimizer._spec import load_study_spec

    spec = load_study_spec(args.spec)
    export = export_study(spec, storage=args.storage, out=args.out, favor=args.favor, study_out=args.study_out)
    print(export.summary())
    if not export.feasible:
        print("kvtune: warning: no trial meets every SLO; recommended.* hold "
              + ("the default config (nothing improves on it)" if export.keep_default else
                 "the trial closest to feasible that is no worse than the default, marked infeasible")
              + "; 'comparison' in recommended.json sets it beside the default", file=sys.stderr)
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as the one error line every kvtune error is (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"kvtune: error: {self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


#: kvtune's own subcommands; any other command name may be a plugin's.
BUILTIN_COMMANDS = ("simulate", "tune", "export", "report", "workload")


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """kvtune's parser; ``plugins=False`` leaves out the plugins' subcommands (nothing of theirs is imported)."""
    parser = _Parser(prog="kvtune", description="Tune vLLM scheduler and KV-cache knobs against "
                                                                "per-class latency targets, by simulation.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from optimizer.cli_simulate import add_simulate_parser
    from optimizer.report.cli import add_report_parser
    from sim.workload.cli import add_workload_parser

    add_simulate_parser(sub)
    add_tune_parser(sub)
    add_export_parser(sub)
    add_report_parser(sub)
    add_workload_parser(sub)
    if plugins:
        from optimizer._plugins import command_adders

        for add in command_adders():  # plugins' subcommands (the replay package: twin, replay, calibrate)
            add(sub)
    return parser


#: Error lines are cut to this many characters.
MAX_ERROR_CHARS = 1000


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kvtune`` program (``argv`` None: this process's arguments), or one command run in-process (tests)."""
    program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # A built-in command parses the same without the plugins' subcommands, so their imports and the entry-point
    # scan (~0.1 s of a process's start) are left out; a trial backend a plugin registers loads on its own use.
    parser = build_parser(plugins=not argv or argv[0] not in BUILTIN_COMMANDS)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None) or getattr(args, "func", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except KvtuneError as exc:
        message = " ".join(str(exc).split())
        if len(message) > MAX_ERROR_CHARS:  # a hostile value must not flood the terminal
            message = message[: MAX_ERROR_CHARS - 3] + "..."
        print(f"kvtune: error: {message}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))  # 2: bad input; a study that stopped itself says 1
    except KeyboardInterrupt as exc:
        terminated = type(exc).__name__ == "Terminated"
        print(f"\nkvtune: {'terminated (SIGTERM)' if terminated else 'interrupted'}; run the same command again "
              f"to resume", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if program:
            _skip_exit_collections()


def _skip_exit_collections() -> None:
    """Before this process exits: move every object the cyclic garbage collector tracks to its permanent generation
    (``gc.freeze``), so that Python's finalization does not run full collections over all of them (a simulation's
    tables, profiles and pandas' modules): ~0.13 of the ~1.6 CPU s of a ``kvtune simulate`` process under load
    (benchmarks/speed/README.md).  They are still freed by reference counting as the modules are cleared; only
    objects kept alive by reference cycles alone are left to the operating system, whose ``__del__`` Python does not
    promise to run at exit anyway.  Never for an in-process call (tests): there it would hold their garbage."""
    import gc

    gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
