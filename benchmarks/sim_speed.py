"""Simulator speed: simulated requests per wall-second and peak memory on the full Azure conversation trace.

Llama-3-8B on H100-SXM, default knobs (vllm-v1), at 1x and 4x the trace's arrival rate, and the trace
repeated 10 times back to back (10x the requests) to show how time grows with request count.  Each case runs
in its own process (one core) so that its peak RSS is its own.

    python benchmarks/sim_speed.py [--cases 1x,4x,10x-requests]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time


def _case(name: str, queue) -> None:
    import pandas as pd

    from sim.engine.config import EngineConfig
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate
    from sim.workload import bundled_trace_path, load_trace

    workload = load_trace(bundled_trace_path())
    if name == "4x":
        workload = workload.scale_rate(4.0)
    elif name == "10x-requests":
        df = workload.requests
        span = float(df["arrival_s"].iloc[-1]) + 1.0
        copies = []
        for i in range(10):
            part = df.copy()
            part["arrival_s"] = part["arrival_s"] + i * span
            part["request_id"] = part["request_id"] + i * len(df)
            copies.append(part)
        workload = workload.with_requests(pd.concat(copies, ignore_index=True))
    start = time.perf_counter()
    result = simulate(workload, EngineConfig(), load_model("Llama-3-8B"), load_gpu("H100-SXM"))
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((name, len(workload), wall, len(workload) / wall, peak_mb, result.num_iterations, len(result.steps),
               int(result.requests["num_preemptions"].sum())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1x,4x,10x-requests")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print("| case | requests | wall s | simulated req/s | peak RSS MB | engine iterations | step-table rows | preemptions |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        queue = ctx.Queue()
        proc = ctx.Process(target=_case, args=(name, queue))
        proc.start()
        row = queue.get()
        proc.join()
        print("| {} | {} | {:.2f} | {:.0f} | {:.0f} | {} | {} | {} |".format(*row))


if __name__ == "__main__":
    main()
