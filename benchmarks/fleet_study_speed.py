"""Fleet study speed: ``kvtune tune studies/fleet-capacity.yaml --trials 100`` end to end, as a user runs it.

The study (issue 31) searches replicas 1-8 x four devices x BF16/FP8 KV x three routers; the target is 100 trials
in 3 minutes or less on a 2-core machine.  Each run is the real CLI in a fresh process (imports, building the
workload, starting Ray, the trials, the export) writing to a fresh temporary folder; the figure is its wall time
from start to exit, with the study's own summary line (trials finished, failed, feasible; start-up, trials,
storage).  Figures: studies/README.md, "fleet-capacity.yaml".

    python benchmarks/fleet_study_speed.py [--spec studies/fleet-capacity.yaml] [--trials 100] [--repeats 1]
                                           [-- extra kvtune tune arguments, e.g. --in-process]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(ROOT / "studies" / "fleet-capacity.yaml"))
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="more kvtune tune arguments (after --)")
    opts = parser.parse_args(argv)
    kvtune = shutil.which("kvtune") or "kvtune"
    for run in range(opts.repeats):
        out = Path(tempfile.mkdtemp(prefix="kvtune-fleet-study-"))
        cmd = [kvtune, "tune", opts.spec, "--trials", str(opts.trials), "--out", str(out), *opts.extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        summary = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                   if line.startswith(("study ", "recommended trial"))]
        print(f"run {run + 1}: {' '.join(cmd[1:])}")
        print(f"  wall {wall:.1f} s (exit {proc.returncode}); target 180 s: {'met' if wall <= 180 else 'missed'}")
        for line in summary:
            print(f"  {line}")
        rec = out / "recommended.json"
        if rec.exists():
            picked = json.loads(rec.read_text())
            print(f"  recommended: {picked['deployment']['description']}; {picked['trial_values']}")
        shutil.rmtree(out, ignore_errors=True)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
