"""``kvtune report SPEC [--storage URL] [--study-out DIR] --out DIR [--favor CLASS] [--whatif K=V[,K=V]]...
[--sweep KNOB=V1,V2,...]``

Wire it into the ``kvtune`` parser with :func:`add_report_parser` (as ``optimizer/cli.py`` does for tune/export).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from optimizer._cli_args import add_study_arguments


def add_report_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report (and PNG charts) of a study",
        description="Write report.html (one self-contained page: plotly inlined, opens offline), report.json and "
                    "images/*.png for a study that 'kvtune tune' ran: default vs recommended config per class, "
                    "the Pareto front, per-class p99 against throughput, recompute and new-token busy share per "
                    "trial, timelines of KV usage / queue / preemptions and the tail by cohort (both configs "
                    "re-simulated).")
    add_study_arguments(p, "folder to write the report to")
    p.add_argument("--whatif", action="append", default=[], metavar="[LABEL:]KEY=VALUE[,KEY=VALUE]",
                   help="also simulate the default and recommended configs with these overrides: gpu=H200, "
                        "kv_cache_dtype=fp8, flavor=vllm-v1 (swap becomes CPU offload), rate_scale=1.5 (the "
                        "study's request rate times 1.5), any engine knob; repeatable. One that cannot start on its device "
                        "(the study's check: TP over one node, a dtype the device lacks, weights that do not fit) "
                        "is refused")
    p.add_argument("--whatif-trials", choices=["picked", "all"], default="picked",
                   help="which configs each what-if re-simulates: the default and recommended (picked, default) or "
                        "every complete trial too (all; for small grid studies)")
    p.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2,...",
                   help="set one engine knob to each value on top of the default and the recommended config and "
                        "chart the result (e.g. max_num_seqs=64,128,256,512); repeatable. A value that cannot start "
                        "is refused")
    p.add_argument("--no-png", action="store_true", help="do not export PNG images of the charts")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from optimizer.report import write_report

    command = "kvtune " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv and sys.argv[1:] else None
    result = write_report(args.spec, out=args.out, storage=args.storage, study_out=args.study_out, favor=args.favor,
                          whatifs=args.whatif, whatif_trials=args.whatif_trials, sweeps=args.sweep,
                          png=not args.no_png,
                          command=command)
    print(result.summary())
    if result.image_error and not args.no_png:
        print(f"kvtune: warning: {result.image_error}", file=sys.stderr)
    return 0
