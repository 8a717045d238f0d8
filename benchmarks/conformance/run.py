#!/usr/bin/env python3
"""Conformance of kvtune's ``vllm-v1`` flavor with vLLM 0.33.0's real V1 scheduler, over a matrix of configs.

    cd /work/main && PYTHONPATH=. python benchmarks/conformance/run.py            # whole matrix, ~2-3 min
    PYTHONPATH=. python benchmarks/conformance/run.py --cases 'syn.*scarce'        # a subset (regex on names)
    PYTHONPATH=. python benchmarks/conformance/run.py --record                     # refresh tests/sim/conformance/data

The vLLM side runs in its own venv (``--venv``, default ``$KVTUNE_VLLM_VENV`` or ``/work/vllm-ref-venv``),
installed on demand with the shared recipe (``install_recipe.sh``, ~3 GB, no GPU needed).  See README.md.

This file is the command line; the rest is split by idea: ``matrix.py`` (the traces and cases), ``reference.py``
(running vLLM's side), ``compare_cases.py`` (running kvtune's side and comparing), ``report_text.py`` (REPORT.md),
``record.py`` (``--record``), and ``conformance.py`` (both sides' replay and the comparison itself).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.conformance.compare_cases import compare_cases  # noqa: E402
from benchmarks.conformance.matrix import RECORD_CASES, make_cases, make_fuzz_cases, make_traces  # noqa: E402
from benchmarks.conformance.record import RECORD_DIR, record_cases  # noqa: E402
from benchmarks.conformance.reference import DEFAULT_V0_VENV, DEFAULT_VENV, run_reference  # noqa: E402
from benchmarks.conformance.report_text import NOTES, render_report  # noqa: E402
from benchmarks.conformance.traces import write_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="vLLM reference venv (installed if missing)")
    ap.add_argument("--v0-venv", type=Path, default=DEFAULT_V0_VENV, help="vLLM 0.8.5 venv for the V0 cases")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "kvtune-conformance",
                    help="scratch folder for traces and vLLM outputs")
    ap.add_argument("--cases", default=None, help="regex on case names (trace/variant)")
    ap.add_argument("--parallel", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--reuse-vllm", action="store_true", help="reuse vLLM outputs already in --work")
    ap.add_argument("--no-azure", action="store_true")
    ap.add_argument("--fuzz", type=int, default=40, help="random cases added to the matrix (0: none)")
    ap.add_argument("--fuzz-seed", type=int, default=0)
    ap.add_argument("--report", type=Path, default=None,
                    help="where to write the report (default: REPORT.md here, for a run without --cases)")
    ap.add_argument("--record", action="store_true",
                    help=f"copy the vLLM outputs of {', '.join(RECORD_CASES)} to {RECORD_DIR}")
    args = ap.parse_args()

    t0 = time.time()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    traces = make_traces(include_azure=not args.no_azure)
    cases = make_cases(traces)
    if args.fuzz:
        fuzz_traces, fuzz_cases = make_fuzz_cases(args.fuzz, args.fuzz_seed)
        traces.update(fuzz_traces)
        cases += fuzz_cases
    if args.cases:
        cases = [c for c in cases if re.search(args.cases, c.name)]
    if args.record:
        cases = [c for c in cases if c.name in RECORD_CASES] + [c for c in cases if c.name not in RECORD_CASES]
    if not cases:
        sys.exit("no case matches")
    trace_paths = {}
    for tname in sorted({c.trace for c in cases}):
        path = work / "traces" / f"{tname}.csv"
        path.parent.mkdir(exist_ok=True)
        write_trace(traces[tname], str(path))
        trace_paths[tname] = path

    if not args.reuse_vllm:
        run_reference(cases, traces, trace_paths, work, args.venv, args.v0_venv, args.parallel)

    rows, vllm_version = compare_cases(cases, trace_paths, work)

    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "vllm_version": vllm_version, "wall_s": time.time() - t0,
            "step_base_s": cases[0].config.step_base_s, "step_per_token_s": cases[0].config.step_per_token_s,
            "notes": NOTES}
    report = render_report(rows, meta)
    print(report)
    if args.report is not None or not args.cases:
        (args.report or HERE / "REPORT.md").write_text(report)
    (work / "results.json").write_text(json.dumps(rows, indent=1, default=str))

    if args.record:
        record_cases(cases, traces, trace_paths, work)


if __name__ == "__main__":
    main()
