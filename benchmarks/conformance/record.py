"""``run.py --record``: keep the reference outputs of a few small cases in the repository, for the tests that
replay them without vLLM (tests/sim/conformance).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from benchmarks.conformance.conformance import Case, write_compact_steps
from benchmarks.conformance.matrix import RECORD_CASES
from benchmarks.conformance.reference import out_dir
from benchmarks.conformance.traces import trace_max_model_len

#: Where ``--record`` keeps the recorded reference that tests/sim/conformance replays without vLLM.
RECORD_DIR = Path(__file__).resolve().parents[2] / "tests" / "sim" / "conformance" / "data"


def record_cases(cases: list[Case], traces: dict, trace_paths: dict, work: Path) -> None:
    """Copy the reference outputs of the cases in ``RECORD_CASES`` (and their traces) to ``RECORD_DIR``, the step
    table compacted and the run's timings dropped, with ``cases.json`` listing them."""
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    recorded = []
    for case in cases:
        if case.name not in RECORD_CASES:
            continue
        d = out_dir(work, case)
        dest = RECORD_DIR / case.name.replace("/", "__")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        shutil.copy(d / "requests.csv", dest / "requests.csv")
        shutil.copy(d / "summary.json", dest / "summary.json")
        write_compact_steps(str(d), str(dest / "sched.csv"))
        summary = json.loads((dest / "summary.json").read_text())
        summary.pop("out", None)
        summary.pop("scheduler_build_s", None)
        summary.pop("replay_loop_s", None)
        (dest / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        recorded.append({"name": case.name, "dir": dest.name, "trace": f"{case.trace}.csv",
                         "max_model_len": case.max_model_len or trace_max_model_len(traces[case.trace]), "config": case.config.__dict__})
        shutil.copy(trace_paths[case.trace], RECORD_DIR / f"{case.trace}.csv")
    (RECORD_DIR / "cases.json").write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"recorded {len(recorded)} cases in {RECORD_DIR}", file=sys.stderr)
