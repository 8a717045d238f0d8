"""Simulator speed: simulated requests per second, engine steps per second, peak memory and where the time goes.

Cases (each in its own process, so that its peak RSS is its own, and on one core):

- ``1x``, ``4x``: the full Azure 2023 conversation trace (19,366 requests), Llama-3-8B on H100-SXM, default
  knobs, at 1x and 4x its arrival rate (the easy, compute-bound regime).
- ``10x-requests``: that trace played 10 times back to back (193,660 requests): time against request count.
- ``incident``: the KV-pressure incident (studies/kv-pressure-incident.yaml): Llama-3-8B on one L40S, the trace
  at 1.25x, first 4,000 requests, 120 s client timeouts, default knobs.
- ``offload``: the incident with a 16 GiB CPU KV tier (``kv_offloading_size_gb``: V1 write-through offload, the
  configs the incident study searches beside recompute).
- ``overload-4x``: the same requests at 4x the rate with ``max_num_seqs=512`` (preemption storms).
- ``reasoning``: a long-output reasoning workload: the incident trace's first 2,000 requests at 0.25x, no
  client timeouts, output lengths redrawn from a lognormal of mean 2,700 tokens (seeded; capped by the
  8,192-token context, mean ~2,470), so that requests are preempted and re-prefilled again and again (up to
  14 times each).
- ``prefix``: the incident workload with Mooncake-style ``hash_ids`` (one id per 512-token block; 64 shared
  system prompts of 1-4 blocks, the rest unique), prefix caching on.
- ``v0-swap``: the reasoning workload on ``vllm-v0`` with ``preemption_mode=swap`` and 64 GiB of swap space.
- ``1m``: one million requests generated from the trace (its lengths, Poisson arrivals at the trace's mean 5.5 req/s),
  Llama-3-8B on H100-SXM, run as a study trial runs: no step table kept (its totals accumulated in chunks,
  ``record_steps=False`` with ``objectives.StepTotals``), no ended request's state (``keep_requests=False``),
  and the trial's metrics (``objectives.summarize``) computed inside the timed, peak-measured part.
  ``gen-N``: the same with N requests (time and memory against request count).

Figures: wall seconds and CPU seconds of ``simulate`` (process time; on a shared machine wall time inflates,
CPU time less so), simulated requests per CPU second, engine iterations per CPU second, peak RSS of the
process, and, from a second run of the same case under cProfile, the share of ``simulate`` spent in the
scheduler (``schedule``, ``update_from_output``, admission and aborts), the latency model (every
``LatencyModel`` method) and building the result tables.  cProfile slows Python calls unevenly, so the shares
are indicative, and given only for the interpreted engine: cProfile sees no function of the compiled one
(``sim/_compiled.py``; the header says which ran), so run ``KVTUNE_PURE_PYTHON=1 python benchmarks/sim_speed.py``
for them, and ``benchmarks/tools/compiled_profile.py`` (callgrind) for where the compiled engine's time goes.
``kernel load s``: loading the engine's compiled kernels in the fresh process (numba, from its on-disk cache), done
before the clock starts, as a study worker does at its warm-up.

    python benchmarks/sim_speed.py [--cases 1x,4x,...] [--no-profile] [--repeats N] [--engine CHECKOUT]
                                   [--decode-columns off]

The two acceleration layers can be switched off for a comparison (benchmarks/speed/README.md, "The accelerated
engine"): ``KVTUNE_PURE_PYTHON=1`` (mypyc's modules interpreted), ``NUMBA_DISABLE_JIT=1`` (numba's kernels run
as Python), both, ``--decode-columns off`` (the running batch as Request objects).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # (a spawned case process has its parent's sys.path, --engine first)
    sys.path.insert(0, str(ROOT))  # this checkout's sim/, not an installed one
CASES = ("1x", "4x", "10x-requests", "incident", "offload", "overload-4x", "reasoning", "prefix", "v0-swap")
ALL_CASES = CASES + ("1m",)


def _incident_workload(rate_scale: float = 1.25, max_requests: int = 4000, timeouts: bool = True):
    from sim.safe_yaml import read_yaml
    from sim.workload import WorkloadSpec

    spec = read_yaml(ROOT / "studies" / "kv-pressure-incident.yaml")
    section = dict(spec["workload"], rate_scale=rate_scale, max_requests=max_requests)
    if not timeouts:
        section["classes"] = {name: {k: v for k, v in cls.items() if k != "timeout_s"}
                              for name, cls in section["classes"].items()}
    return WorkloadSpec.from_dict(section, base_dir=ROOT / "studies").build()


def _reasoning_workload():
    """The incident trace's first 2,000 requests at 0.25x, no client timeouts, output lengths redrawn from a
    lognormal (mean 2,700 tokens, sigma 0.8, seed 0) capped at the model's 8,192-token context."""
    import numpy as np

    workload = _incident_workload(rate_scale=0.25, max_requests=2000, timeouts=False)
    df = workload.requests.copy()
    rng = np.random.default_rng(0)
    sigma, mean = 0.8, 2700.0
    out = rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, len(df))
    df["output_tokens"] = np.clip(np.rint(out), 1, 8192 - df["prompt_tokens"].to_numpy() - 1).astype(np.int64)
    return workload.with_requests(df)


def _build(name: str):
    """(workload, config, model name, gpu name, simulate kwargs) of a case."""
    import numpy as np

    from sim.engine.config import EngineConfig
    from sim.workload import bundled_trace_path, load_trace

    if name in ("1x", "4x", "10x-requests"):
        workload = load_trace(bundled_trace_path())
        if name == "4x":
            workload = workload.scale_rate(4.0)
        elif name == "10x-requests":
            one = workload
            for _ in range(9):
                workload = workload.concat(one, gap_s=1.0)
        return workload, EngineConfig(), "Llama-3-8B", "H100-SXM", {}
    if name == "incident":
        return _incident_workload(), EngineConfig(), "Llama-3-8B", "L40S", {}
    if name == "offload":
        # The study's CPU-offload configs (kv-pressure-incident.yaml searches preemption_mode: offload): 16 GiB of
        # CPU tier, about 8,200 blocks against the L40S's 12,481 GPU blocks.
        return _incident_workload(), EngineConfig(kv_offloading_size_gb=16.0), \
            "Llama-3-8B", "L40S", {}
    if name == "overload-4x":
        return _incident_workload(rate_scale=4.0), EngineConfig(max_num_seqs=512), "Llama-3-8B", "L40S", {}
    if name in ("reasoning", "v0-swap"):
        workload = _reasoning_workload()
        if name == "v0-swap":
            return workload, EngineConfig(flavor="vllm-v0", preemption_mode="swap", swap_space_gb=64), \
                "Llama-3-8B", "L40S", {}
        return workload, EngineConfig(), "Llama-3-8B", "L40S", {}
    if name == "prefix":
        workload = _incident_workload()
        df = workload.requests.copy()
        rng = np.random.default_rng(0)
        prompts = df["prompt_tokens"].to_numpy()
        system = rng.integers(0, 64, len(df))  # which shared system prompt
        system_blocks = 1 + system % 4  # 1-4 blocks of 512 tokens
        next_id = 10_000
        hashes = []
        for prompt, sys_id, sys_len in zip(prompts, system, system_blocks):
            blocks = -(-int(prompt) // 512)
            shared = min(int(sys_len), blocks)
            ids = [int(sys_id) * 4 + j for j in range(shared)]
            ids += list(range(next_id, next_id + blocks - shared))
            next_id += blocks - shared
            hashes.append(ids)
        df["hash_ids"] = hashes
        return workload.with_requests(df), EngineConfig(enable_prefix_caching=True), "Llama-3-8B", "L40S", {}
    if name == "1m" or name.startswith("gen-"):
        import pandas as pd

        from sim.workload import Workload

        base = load_trace(bundled_trace_path()).requests
        n = 1_000_000 if name == "1m" else int(name[4:])
        rng = np.random.default_rng(0)
        pick = rng.integers(0, len(base), n)
        df = pd.DataFrame({
            "request_id": np.arange(n, dtype=np.int64),
            "class": "default",
            "arrival_s": np.cumsum(rng.exponential(1 / 5.5, n)),
            "prompt_tokens": base["prompt_tokens"].to_numpy()[pick],
            "output_tokens": base["output_tokens"].to_numpy()[pick],
        })
        return Workload(df), EngineConfig(), "Llama-3-8B", "H100-SXM", {"trial": True}
    raise SystemExit(f"unknown case {name!r}; cases: {', '.join(ALL_CASES)}")


_BUCKETS = {
    "scheduler": ("/sim/engine/scheduler_", "/sim/engine/kv_cache.py", "/sim/engine/request.py"),
    "latency": ("/sim/latency/",),
    "tables": ("/sim/tables.py",),
}


def _bucket(path: str) -> str | None:
    path = path.replace(os.sep, "/")
    for name, parts in _BUCKETS.items():
        if any(part in path for part in parts):
            return name
    return None


def _shares(profile) -> dict[str, float]:
    """Seconds spent inside the scheduler, the latency model and the tables (callees included), from a cProfile
    run: each bucket's functions' cumulative time, counted only for calls from outside the bucket."""
    import pstats

    stats = pstats.Stats(profile).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    buckets = dict.fromkeys(_BUCKETS, 0.0)
    for (path, _line, _func), (_cc, _nc, _tt, _ct, callers) in stats.items():
        name = _bucket(path)
        if name is not None:
            buckets[name] += sum(v[3] for c, v in callers.items() if _bucket(c[0]) != name)
    return buckets


def _case(name: str, profile: bool, queue, columns: bool = True) -> None:
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate

    workload, config, model, gpu, kwargs = _build(name)
    if not columns:
        kwargs["decode_columns"] = False
    model, gpu = load_model(model), load_gpu(gpu)
    from sim.engine.decode_columns import warm_up

    load0 = time.perf_counter()
    warm_up()  # the compiled kernels' one-off load per process (a study worker pays it at its warm-up)
    kernel_load = time.perf_counter() - load0
    totals = None
    if kwargs.pop("trial", False):
        # What a study trial runs: no step table and no finished request's state kept, step metrics
        # accumulated as the run goes, and the trial's metrics (``summarize``) counted in the peak.
        from objectives import StepTotals

        totals = StepTotals()
        kwargs.update(record_steps=False, keep_requests=False, step_sink=totals.add)
    if profile:
        import cProfile

        prof = cProfile.Profile(time.process_time)
        cpu0 = time.process_time()
        prof.enable()
        simulate(workload, config, model, gpu, **kwargs)
        prof.disable()
        total = time.process_time() - cpu0
        prof.create_stats()
        shares = {k: v / total for k, v in _shares(prof).items()}
        queue.put(shares)
        return
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = simulate(workload, config, model, gpu, **kwargs)
    if totals is not None:
        from objectives import summarize

        summarize(result.requests, totals, workload.classes).to_dict()
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    req = result.requests
    import sim

    queue.put({
        "engine": str(Path(sim.__file__).resolve().parent.parent),
        "requests": len(workload), "kernel_load": kernel_load, "wall": wall, "cpu": cpu, "peak_mb": peak_mb, "base_mb": base_rss,
        "iterations": result.num_iterations, "rows": len(result.steps) if result.steps is not None else 0,
        "preemptions": int(req["num_preemptions"].sum()),
        "timed_out": int((req["status"] == "timed_out").sum()),
    })


def _run(ctx, name: str, profile: bool, columns: bool = True):
    import queue as queues

    queue = ctx.Queue()
    proc = ctx.Process(target=_case, args=(name, profile, queue, columns))
    proc.start()
    while True:  # a case process that died (its traceback is on stderr) ends the script instead of hanging it
        try:
            row = queue.get(timeout=1.0)
            break
        except queues.Empty:
            if not proc.is_alive():
                raise SystemExit(f"case {name}: its process exited with {proc.exitcode} before reporting") from None
    proc.join()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(ALL_CASES)}")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per case (median reported)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run that gives the shares")
    ap.add_argument("--engine", type=Path, help="run this script's cases on another checkout's engine (its sim/, "
                                                "objectives/): before-and-after timings of a change")
    ap.add_argument("--decode-columns", choices=("on", "off"), default="on",
                    help="off: the running batch as Request objects only (no numba column kernels, so no numba "
                         "at all: the prefix pool and the CPU tier are compiled Python)")
    args = ap.parse_args()
    if args.engine is not None:
        if not (args.engine / "sim" / "runner.py").is_file():
            raise SystemExit(f"--engine {args.engine}: not a kvtune checkout (no sim/runner.py)")
        sys.path.insert(0, str(args.engine.resolve()))
    import importlib.util

    engine = Path(importlib.util.find_spec("sim").origin).parent.parent
    try:
        from sim import compiled_state
    except ImportError:  # an --engine checkout from before sim.compiled_state (2026-12-06): ask its module
        try:
            compiled_state = importlib.import_module("sim._compiled").state
        except ImportError:
            compiled_state = None
    # the children decide the same way (same sources, build and environment)
    native = compiled_state() if compiled_state else "interpreted (a checkout without sim/_compiled.py)"
    numba = "off (NUMBA_DISABLE_JIT)" if os.environ.get("NUMBA_DISABLE_JIT", "") not in ("", "0") else "on"
    ctx = mp.get_context("spawn")
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; req/s and steps/s per CPU second;"
          f" engine {engine}, {native}, numba {numba}, decode columns {args.decode_columns}")
    print("| case | requests | wall s | CPU s | sim req/s (CPU) | sim req/s (wall) | engine steps/s (CPU) | "
          "peak RSS MB | iterations | step rows | preemptions | timed out | scheduler | latency | tables | "
          "kernel load s |")
    print("|" + "---|" * 16)
    for name in args.cases.split(","):
        runs = [_run(ctx, name, False, args.decode_columns == "on") for _ in range(max(1, args.repeats))]
        if runs[0]["engine"] != str(engine.resolve()):
            raise SystemExit(f"the case ran {runs[0]['engine']}'s engine, not {engine}")
        row = dict(runs[0])
        row["wall"] = statistics.median(r["wall"] for r in runs)
        row["cpu"] = statistics.median(r["cpu"] for r in runs)
        row["peak_mb"] = max(r["peak_mb"] for r in runs)
        shares = {"scheduler": float("nan"), "latency": float("nan"), "tables": float("nan")}
        # cProfile sees no function of the compiled engine (its time lands in the interpreted caller), so the
        # shares are only given for the interpreted one (KVTUNE_PURE_PYTHON=1).
        if not args.no_profile and name != "1m" and not name.startswith("gen-") and native != "compiled":
            shares = _run(ctx, name, True, args.decode_columns == "on")
        print(f"| {name} | {row['requests']} | {row['wall']:.2f} | {row['cpu']:.2f} | "
              f"{row['requests'] / row['cpu']:.0f} | {row['requests'] / row['wall']:.0f} | "
              f"{row['iterations'] / row['cpu']:.0f} | {row['peak_mb']:.0f} | {row['iterations']} | {row['rows']} | "
              f"{row['preemptions']} | {row['timed_out']} | {shares['scheduler']:.0%} | {shares['latency']:.0%} | "
              f"{shares['tables']:.0%} | {statistics.median(r['kernel_load'] for r in runs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
