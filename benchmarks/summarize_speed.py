"""Metric reduction speed: CPU milliseconds of ``objectives.summarize(...).to_dict()`` on one simulated run.

Simulates a ``sim_speed`` case once as a study trial does (``record_steps=False``, step totals streamed into
``objectives.StepTotals``, ``keep_requests=False``), then times ``summarize(requests, totals, classes).to_dict()``
``--repeats`` times (process time) and prints the sorted times and the number of keys; ``--profile`` adds one
cProfile run.  ``--engine CHECKOUT`` imports ``objectives`` and ``sim`` from another checkout (before-and-after
timings of a change).

    python benchmarks/summarize_speed.py [--case incident] [--repeats 7] [--profile] [--engine CHECKOUT]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="incident", help="a sim_speed case (benchmarks/sim_speed.py)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="print the top of one cProfile run")
    ap.add_argument("--engine", type=Path, help="import objectives/ and sim/ from this checkout")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import sim_speed  # puts this checkout first on sys.path

    if args.engine is not None:
        if not (args.engine / "objectives" / "_summary.py").is_file():
            raise SystemExit(f"--engine {args.engine}: not a kvtune checkout (no objectives/_summary.py)")
        sys.path.insert(0, str(args.engine.resolve()))
    import objectives
    from objectives import StepTotals, summarize
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate

    workload, config, model, gpu, _ = sim_speed._build(args.case)
    totals = StepTotals()
    result = simulate(workload, config, load_model(model), load_gpu(gpu), record_steps=False, keep_requests=False,
                      step_sink=totals.add)
    times = []
    for _ in range(max(1, args.repeats)):
        start = time.process_time()
        metrics = summarize(result.requests, totals, workload.classes).to_dict()
        times.append(time.process_time() - start)
    print(f"{args.case}: {len(result.requests)} requests, {len(metrics)} keys; objectives from "
          f"{Path(objectives.__file__).parent}")
    print("summarize ms (sorted):", sorted(round(1000 * t, 1) for t in times))
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        summarize(result.requests, totals, workload.classes).to_dict()
        profile.disable()
        pstats.Stats(profile).sort_stats("cumtime").print_stats(20)


if __name__ == "__main__":
    main()
