"""Scale of one ``kvtune simulate``: peak memory and time against the number of requests (issue 34: "1M requests
in <= 1 GB peak and time linear to 10M requests").

Each size N runs the whole ``kvtune simulate`` command (``python -m optimizer.cli simulate``: imports, trace
loading, the run, the metrics, ``requests.parquet``, ``steps.parquet`` and ``summary.json`` written) in a fresh
process, on the incident's engine: Llama-3-8B on one L40S, default knobs, the bundled Azure 2023 conversation trace
at 1.25x its rate (``--rate-scale 1.25``, as ``studies/kv-pressure-incident.yaml``; the CLI has no class rules, so
one class and no client timeouts).  N requests are the bundled trace (19,366 requests, one hour) played end to end
as often as needed (each copy 1 s after the one before, request ids renumbered), cut at N, written once as a
normalized parquet trace under ``--work`` (``tiled-N.parquet``) and passed as ``--trace``: at 1.25x the engine keeps
up with each hour (its KV cache runs near full and preempts, as in the incident), so the load does not pile up
from one copy to the next and the work per request stays the same.

Figures per N, from the child alone (``os.wait4``): peak RSS (``ru_maxrss``), wall seconds of the process, CPU
seconds (user + system), and per request; ``sim wall s`` is the run loop's own (``summary.json``'s ``wall_s``);
the step rows and the request table's size in memory (pandas, deep) and on disk (``requests.parquet``), from the
files the run wrote, read back here after the child ended (so not in its peak).  Sizes run smallest first; the
series stops before a size whose peak, extrapolated linearly from the last two, would pass ``--max-rss-mb``.

    python benchmarks/sim_scale.py [--sizes 100000,1000000,3000000,10000000] [--work /tmp/kvtune-scale]
        [--max-rss-mb 8000] [--keep-outputs] [--python PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from optimizer import add_rate_scale_argument  # noqa: E402 (after the path set-up)

HOUR_GAP_S = 1.0


def tiled_trace(n: int, work: Path) -> Path:
    """The bundled trace played end to end until it holds ``n`` requests, as a normalized parquet trace."""
    path = work / f"tiled-{n}.parquet"
    if path.exists():
        return path
    import numpy as np
    import pandas as pd

    from sim.workload import bundled_trace_path, load_trace

    base = load_trace(bundled_trace_path()).requests
    arrivals = base["arrival_s"].to_numpy(dtype=float)
    arrivals = arrivals - arrivals[0]
    period = arrivals[-1] + HOUR_GAP_S
    copies = -(-n // len(base))
    frame = pd.DataFrame({
        "arrival_s": (arrivals[None, :] + period * np.arange(copies)[:, None]).ravel()[:n],
        "prompt_tokens": np.tile(base["prompt_tokens"].to_numpy(dtype=np.int64), copies)[:n],
        "output_tokens": np.tile(base["output_tokens"].to_numpy(dtype=np.int64), copies)[:n],
    })
    work.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.rename(path)
    return path


def run_one(n: int, work: Path, python: str, rate_scale: float, extra: list[str]) -> dict:
    trace = tiled_trace(n, work)
    out = work / f"out-{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [python, "-m", "optimizer.cli", "simulate", "--trace", str(trace), "--model", "Llama-3-8B", "--gpu",
           "L40S", "--rate-scale", str(rate_scale), "--out", str(out), *extra]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert child.stdout is not None
    stdout = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"N={n}: {' '.join(cmd)} exited {child.returncode}:\n{stdout[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    import pyarrow.parquet as pq

    step_rows = pq.ParquetFile(out / "steps.parquet").metadata.num_rows
    request_file = (out / "requests.parquet").stat().st_size
    row = {
        "requests": n, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024,
        "sim_wall_s": summary["wall_s"], "step_rows": step_rows, "request_file_b": request_file, "load": load,
        "command": " ".join(cmd),
        "finished": summary["metrics"].get("all.count.finished"),
        "preemptions": summary["metrics"].get("preemptions_total"),
    }
    if n <= 1_000_000:  # the table in memory, read back here (not in the child's peak)
        import pandas as pd

        row["request_mem_b"] = int(pd.read_parquet(out / "requests.parquet").memory_usage(deep=True).sum())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000,3000000,10000000")
    parser.add_argument("--work", default="/tmp/kvtune-scale", help="traces and outputs (default /tmp/kvtune-scale)")
    parser.add_argument("--max-rss-mb", type=float, default=8000.0,
                        help="skip a size whose extrapolated peak passes this (default 8000)")
    add_rate_scale_argument(parser, default=1.25)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--keep-outputs", action="store_true", help="keep each run's out-N folder")
    parser.add_argument("extra", nargs="*", help="more `kvtune simulate` arguments (after --)")
    args = parser.parse_args(argv)
    work = Path(args.work)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    rows: list[dict] = []
    print(f"kvtune simulate, Llama-3-8B on L40S, bundled trace tiled, --rate-scale {args.rate_scale}; "
          f"{os.cpu_count()} CPUs", flush=True)
    for n in sizes:
        if len(rows) >= 1:
            a = rows[-2] if len(rows) >= 2 else {"requests": 0, "peak_mb": rows[-1]["peak_mb"] * 0.5}
            b = rows[-1]
            slope = (b["peak_mb"] - a["peak_mb"]) / (b["requests"] - a["requests"])
            guess = b["peak_mb"] + slope * (n - b["requests"])
            if guess > args.max_rss_mb:
                print(f"N={n:,}: skipped, peak would be ~{guess:.0f} MB > --max-rss-mb {args.max_rss_mb:.0f}")
                break
        row = run_one(n, work, args.python, args.rate_scale, args.extra)
        if not args.keep_outputs:
            shutil.rmtree(work / f"out-{n}", ignore_errors=True)
        rows.append(row)
        print(f"N={n:,}: peak {row['peak_mb']:.0f} MB, wall {row['wall_s']:.1f} s, cpu {row['cpu_s']:.1f} s "
              f"(sim loop {row['sim_wall_s']:.1f} s), {row['step_rows']:,} step rows, load {row['load']:.1f}",
              flush=True)
    print(f"\ncommand: {rows[0]['command'] if rows else ''} (N = each size)\n")
    print("| requests | peak RSS MB | wall s | CPU s | CPU us/request | sim loop s | step rows | request table "
          "in memory B/request | requests.parquet B/request | load avg at start |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mem = f"{r['request_mem_b'] / r['requests']:.0f}" if "request_mem_b" in r else "-"
        print(f"| {r['requests']:,} | {r['peak_mb']:.0f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['cpu_s'] / r['requests'] * 1e6:.1f} | {r['sim_wall_s']:.1f} | {r['step_rows']:,} | {mem} | "
              f"{r['request_file_b'] / r['requests']:.1f} | {r['load']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
