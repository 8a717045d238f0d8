"""A single ``kvtune simulate`` run's simulation, cold: each case in a fresh process, run as the command runs it
(no kernel warm-up before the clock, no request state kept, step rows streamed into ``sim.tables.StepColumns``),
and the figure its ``summary.json`` reports: ``simulated_requests_per_wall_s`` (requests over ``SimResult.wall_s``),
with the simulation's CPU seconds beside it.

Paired, A B A B: A keeps the decode columns on (``Simulation(decode_columns=True)``: loads their numba kernels in
the run, the default before issue 34's change), B the default (``decode_columns=None``: columns only where their
kernels are loaded already, numba loads anyway, or the run is long; ``sim.engine.decode_columns.worth_loading``).
Same tables either way (tests/sim/engine/test_decode_columns.py).  With ``--vs CHECKOUT``, A is instead the default
engine of another checkout (e.g. a ``git worktree`` of the commit before a change, compiled in place with
``python setup.py build_ext --inplace``) and B this checkout's: a before/after pair.  Prints each run and, per case,
the medians and B's figure over A's pair by pair (median, min-max).

    python benchmarks/sim_cold.py [--cases incident,overload-4x,reasoning,prefix,v0-swap,offload] [--pairs 4]
    taskset -c 1 python benchmarks/sim_cold.py --vs /tmp/before --cases prefix,offload --pairs 4

The cases are benchmarks/sim_speed.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _one(case: str, mode: str) -> None:
    cpu0 = time.process_time()
    sys.path.insert(0, str(ROOT))
    from benchmarks.sim_speed import _build
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate
    from sim.tables import StepColumns

    workload, config, model, gpu, _ = _build(case)
    model, gpu = load_model(model), load_gpu(gpu)
    kwargs = {"decode_columns": True} if mode == "A" else {}
    steps = StepColumns()
    cpu1 = time.process_time()
    result = simulate(workload, config, model, gpu, keep_requests=False, record_steps=False, step_sink=steps.add,
                      **kwargs)
    cpu2 = time.process_time()
    print(json.dumps({"case": case, "mode": mode, "requests": len(workload), "wall_s": result.wall_s,
                      "cpu_s": cpu2 - cpu1, "process_cpu_s": cpu2 - cpu0, "iterations": result.num_iterations}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="incident,overload-4x,reasoning,prefix,v0-swap,offload")
    ap.add_argument("--pairs", type=int, default=4, help="counted A B pairs per case (after one warm-up pair)")
    ap.add_argument("--vs", type=Path, metavar="CHECKOUT",
                    help="A: another checkout's default engine (built in place); B: this checkout's")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _one(*args.one)
        return
    print("| case | requests | A wall req/s | B wall req/s | B/A wall req/s | A sim CPU s | B sim CPU s | A/B CPU | "
          "B req/s (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        runs: dict[str, list[dict]] = {"A": [], "B": []}
        for pair in range(args.pairs + 1):
            for mode in ("A", "B"):
                root, engine = ROOT, mode
                if args.vs:  # both run the default engine, A in the other checkout
                    root, engine = (args.vs.resolve() if mode == "A" else ROOT), "B"
                out = subprocess.run([sys.executable, str(root / "benchmarks" / "sim_cold.py"), "--one", case, engine],
                                     check=True, cwd=root, capture_output=True, text=True,
                                     env=dict(os.environ, PYTHONPATH=str(root))).stdout
                run = json.loads(out.strip().splitlines()[-1])
                print(f"  {run}", file=sys.stderr)
                if pair:
                    runs[mode].append(run)
        a, b = runs["A"], runs["B"]
        assert {r["iterations"] for r in a} == {r["iterations"] for r in b}, "the two ran different iterations"
        n = a[0]["requests"]
        wall = [(n / y["wall_s"]) / (n / x["wall_s"]) for x, y in zip(a, b)]
        cpu = [x["cpu_s"] / y["cpu_s"] for x, y in zip(a, b)]
        med = statistics.median
        print(f"| {case} | {n} | {med(n / r['wall_s'] for r in a):,.0f} | {med(n / r['wall_s'] for r in b):,.0f} | "
              f"{med(wall):.2f}x ({min(wall):.2f}-{max(wall):.2f}) | {med(r['cpu_s'] for r in a):.3f} | "
              f"{med(r['cpu_s'] for r in b):.3f} | {med(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f}) | "
              f"{med(n / r['cpu_s'] for r in b):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
