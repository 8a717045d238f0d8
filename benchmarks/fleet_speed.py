"""Fleet simulator speed: simulated requests per second of fleets of N replicas behind a router, against the single
engine on the same per-engine load.

The bundled Azure 2023 conversation trace (19,366 requests; ``--requests`` takes its first N), Llama-3-8B on
H100-SXM, default knobs, optional Mooncake-style ``hash_ids`` (``--prefix``: 64 shared system prompts of 1-4
512-token blocks, prefix caching on).  The single engine runs it at ``--rate-scale``; a fleet of N replicas runs the
same requests at N times that rate, so each replica carries about the single engine's load and the fleet simulates
the same requests in 1/N of the simulated time.  Both run as a study trial does (no step table, no ended request's
state kept).  Figures: wall and CPU seconds of the run, simulated requests per CPU second, and that rate over the
single engine's.  Each case runs in its own process, best of ``--repeats``.

A router that reads engine state (every router but round_robin and session_affinity) is asked at each arrival, and
before each arrival only the replicas with a step boundary, run end or wake-up before it are advanced to it
(``sim.runner.EngineLoop.advance``; no SimPy event per replica step); a replica's run of identical decode steps
ends only at an arrival routed to it (cut there, as a bound known in advance would have ended it).  A router that
reads none is run ahead of the simulation, and each replica then runs through its own arrivals, one replica after
another (``sim.fleet._loop.run_routed``).  Figures: benchmarks/speed/README.md, "Fleet speed".

    python benchmarks/fleet_speed.py [--replicas 1,8,64] [--routers round_robin,least_outstanding]
                                     [--requests N] [--rate-scale X] [--prefix] [--caching] [--repeats N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: ``compare_case``'s requests: the trace's first N.
COMPARE_REQUESTS = 3000


def _workload(requests: int | None, rate: float, prefix: bool):
    import numpy as np

    from sim.workload import bundled_trace_path, load_trace

    workload = load_trace(bundled_trace_path())
    df = workload.requests if requests is None else workload.requests.head(requests)
    df = df.reset_index(drop=True)
    if prefix:
        df = df.copy()
        rng = np.random.default_rng(0)
        system = rng.integers(0, 64, len(df))
        next_id, hashes = 10_000, []
        for prompt, sys_id in zip(df["prompt_tokens"].to_numpy(), system):
            blocks = -(-int(prompt) // 512)
            shared = min(1 + int(sys_id) % 4, blocks)
            hashes.append([int(sys_id) * 4 + j for j in range(shared)] + list(range(next_id, next_id + blocks - shared)))
            next_id += blocks - shared
        df["hash_ids"] = hashes
    return workload.with_requests(df).scale_rate(rate)


def compare_case(name: str) -> tuple:
    """A fleet case of ``benchmarks/tools/compare_tables.py``, ``fleet:ROUTER:N:VARIANT``: (workload, config, model,
    gpu, ``simulate_fleet`` kwargs), VARIANT ``plain``, ``prefix`` or ``pressure`` (its docstring says what each is)."""
    import dataclasses

    from sim.engine.config import EngineConfig

    _, router, replicas, variant = name.split(":")
    n = int(replicas)
    workload = _workload(COMPARE_REQUESTS, float(n), variant != "plain")
    config = EngineConfig(enable_prefix_caching=variant != "plain")
    kwargs = dict(replicas=n, router=router, record_steps=True)
    if variant == "pressure":
        config = dataclasses.replace(config, num_gpu_blocks_override=900)
        classes = {key: dataclasses.replace(cls, timeout_s=4.0, cancel_probability=0.1)
                   for key, cls in workload.classes.items()}
        workload = dataclasses.replace(workload, classes=classes)
        kwargs["seed"] = 3
    return workload, config, "Llama-3-8B", "H100-SXM", kwargs


def _case(args: tuple) -> dict:
    replicas, router, requests, rate, prefix, caching = args
    import sim  # noqa: F401 - the compiled-engine check, before timing
    from sim import compiled_state
    from sim.engine.config import EngineConfig
    from sim.fleet import simulate_fleet
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate

    workload = _workload(requests, rate * (replicas or 1), prefix)
    config = EngineConfig(enable_prefix_caching=prefix or caching)
    model, gpu = load_model("Llama-3-8B"), load_gpu("H100-SXM")
    kwargs = dict(record_steps=False, keep_requests=False)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if replicas == 0:
        result = simulate(workload, config, model, gpu, **kwargs)
        hit = float(result.requests["prefix_hit_tokens"].sum() / result.requests["prompt_tokens"].sum())
        share = 1.0
    else:
        result = simulate_fleet(workload, config, model, gpu, replicas=replicas, router=router, **kwargs)
        hit, share = result.fleet["prefix_hit_rate"], result.fleet["max_load_ratio"]
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = int((result.requests["status"] == "finished").sum())
    return {"cpu_s": cpu, "wall_s": wall, "requests": len(workload), "finished": done,
            "hit_rate": hit, "max_load_ratio": share, "engine": compiled_state()}


def _run(args: tuple, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    best = None
    for _ in range(repeats):
        with ctx.Pool(1) as pool:
            out = pool.apply(_case, (args,))
        if best is None or out["cpu_s"] < best["cpu_s"]:
            best = out
    return best


def main(argv: list[str] | None = None) -> None:
    from optimizer import add_rate_scale_argument

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,8,64")
    parser.add_argument("--routers", default="round_robin,least_outstanding")
    parser.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
    add_rate_scale_argument(parser, help="the single engine's rate; a fleet of N: N times it")
    parser.add_argument("--prefix", action="store_true", help="shared-prefix hash_ids and prefix caching")
    parser.add_argument("--caching", action="store_true",
                        help="prefix caching on without shared prefixes (vLLM's default; each request re-hits only "
                             "its own blocks)")
    parser.add_argument("--repeats", type=int, default=1)
    opts = parser.parse_args(argv)
    replicas = [int(x) for x in opts.replicas.split(",")]
    routers = opts.routers.split(",")
    base = _run((0, None, opts.requests, opts.rate_scale, opts.prefix, opts.caching), opts.repeats)
    rate0 = base["requests"] / base["cpu_s"]
    print(f"engine: {base['engine']}; {base['requests']} requests; prefix: {opts.prefix}; caching: {opts.prefix or opts.caching}; rate scale "
          f"{opts.rate_scale} per engine")
    header = f"{'case':<34} {'wall s':>7} {'cpu s':>7} {'req/cpu s':>10} {'vs single':>9} {'hit rate':>8} {'max share':>9}"
    print(header)
    print(f"{'single engine':<34} {base['wall_s']:7.2f} {base['cpu_s']:7.2f} {rate0:10.0f} {1.0:9.2f} "
          f"{base['hit_rate']:8.3f} {1.0:9.2f}")
    for router in routers:
        for n in replicas:
            out = _run((n, router, opts.requests, opts.rate_scale, opts.prefix, opts.caching), opts.repeats)
            rate = out["requests"] / out["cpu_s"]
            print(f"{f'{n} x {router}':<34} {out['wall_s']:7.2f} {out['cpu_s']:7.2f} {rate:10.0f} "
                  f"{rate / rate0:9.2f} {out['hit_rate']:8.3f} {out['max_load_ratio']:9.2f}", flush=True)


if __name__ == "__main__":
    main()
