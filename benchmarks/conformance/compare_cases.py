"""The kvtune side of each case and its comparison with the reference: the step-by-step decisions (scheduled and
preempted sets, free blocks, prefix hits, aborts) and, batched as studies run, the per-request outcomes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.conformance.conformance import (
    Case, compare, compare_batched, load_vllm_result, run_kvtune, run_kvtune_batched, vllm_request_times,
)
from benchmarks.conformance.reference import out_dir
from benchmarks.conformance.traces import read_trace, trace_max_model_len

def compare_cases(cases: list[Case], trace_paths: dict, work: Path) -> tuple[list[dict], str]:
    """Run kvtune on every case (step by step, and batched as studies run it) and compare it with the reference's
    outputs in ``work``: one result row per case (``error`` when a side did not run), and vLLM's version."""
    rows = []
    vllm_version = "?"
    for case in cases:
        d = out_dir(work, case)
        label = case.config.label() + (f" mml={case.max_model_len}" if case.max_model_len else "")
        row = {"name": case.name, "trace": case.trace, "label": label, "config": case.config.__dict__}
        if (d / "error.txt").exists() or not (d / "summary.json").exists():
            row["error"] = (d / "error.txt").read_text().strip() if (d / "error.txt").exists() else "no vLLM output"
            rows.append(row)
            continue
        summary = json.loads((d / "summary.json").read_text())
        if case.config.flavor != "vllm-v0":
            vllm_version = summary.get("vllm_version", vllm_version)
        trace = read_trace(str(trace_paths[case.trace]))
        vres = load_vllm_result(str(d))
        try:
            kres = run_kvtune(trace, case.config, case.max_model_len or trace_max_model_len(trace))
            # kvtune as studies run it (identical decode steps batched): same per-request outcome and times?
            kb = run_kvtune_batched(trace, case.config, case.max_model_len or trace_max_model_len(trace))
        except Exception as exc:  # report it as the case's result and go on with the others
            row["error"] = f"kvtune: {type(exc).__name__}: {exc}"
            rows.append(row)
            print(f"{case.name:32s} {row['error']}", file=sys.stderr)
            continue
        row.update(compare(vres, kres))
        row["engine_aborted_vllm"] = bool(summary.get("engine_aborted"))
        row["engine_aborted_kvtune"] = bool(kres.extra.get("aborted"))
        row.update(compare_batched(vllm_request_times(str(d), case.config), kb))
        row["num_requests"] = len(trace)
        rows.append(row)
        fd = row["first_divergence"]
        print(f"{case.name:32s} sched {row['share_same_sched']:7.2%}  preempt {row['preemptions_vllm']:4d}/"
              f"{row['preemptions_kvtune']:<4d}" + ("" if fd is None else f"  first divergence at step {fd['step']}"),
              file=sys.stderr)
    return rows, vllm_version
