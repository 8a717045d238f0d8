"""kvtune's fleet against NVIDIA Dynamo's offline trace replay, on the same Mooncake-style trace and fleet.

Dynamo (ai-dynamo 1.6.1, ``dynamo.replay.run_trace_replay``: its Rust mocker engines behind its real KV router, on a
logical clock, in one process) is the peer: both simulate N vLLM-style workers with paged KV and prefix caching
behind round robin or a KV-aware router.  Both sides read one JSONL trace this script writes deterministically
(``trace``), get the same engine settings (``ENGINE``: 16384 blocks of 64 tokens a worker, max_num_seqs 256,
max_num_batched_tokens 8192, prefix caching and chunked prefill on; Dynamo's mocker defaults, set on kvtune's
engine with ``num_gpu_blocks_override``) and the same router cost (kvtune's ``dynamo_kv`` mirrors Dynamo's
``worker_logit``; Dynamo's router is run in its ``use_kv_events=False`` approximate mode, TTL 120 s, which is what
kvtune's router models).  What differs and cannot be matched: each side's step-time model (kvtune: Llama-3-8B on
H100-SXM from sim/data; Dynamo: its mocker's polynomial), so absolute latencies and the exact interleaving differ;
compare routing (requests per worker, prefix reuse) and speed.

Subcommands (the one-side commands are what a whole-process timer runs, A B A B):

    python benchmarks/fleet_vs_dynamo.py trace --out T.jsonl [--requests 20000] [--seed 0]
    python benchmarks/fleet_vs_dynamo.py kvtune T.jsonl [--workers 8] [--router round_robin|dynamo_kv]
    ~/.cache/kvtune/dynamo-venv/bin/python benchmarks/fleet_vs_dynamo.py dynamo T.jsonl [--workers 8]
                                           [--router round_robin|kv_router] [--per-request]
    python benchmarks/fleet_vs_dynamo.py compare T.jsonl [--workers 8] [--repeats 3] [--no-bytecode-cache]

``compare`` runs each side as its own process, once untimed, then A B A B (kvtune, Dynamo) ``--repeats`` times per
router (kvtune's modules compiled to bytecode once, as Dynamo's were by ``pip install``: ``bytecode_cache.py``;
``--no-bytecode-cache`` leaves the environment's ``PYTHONDONTWRITEBYTECODE`` as it is), and prints
each side's median whole-process wall time (``proc s``: start-up, imports, trace, simulation), its CPU time
(``cpu s``: user + system, which a wait for the core under load does not inflate) and in-process wall time
(``sim s``: reading the trace and simulating, which Dynamo's ``run_trace_replay`` call does in one), the ratio of whole-process times pair by pair, the
prefix reuse ratio (prompt tokens served from the prefix cache over prompt tokens) and the requests per worker.
The ``dynamo`` side needs Dynamo in its own venv (recipe: ``python3 -m venv ~/.cache/kvtune/dynamo-venv``;
``pip install ai-dynamo-runtime==1.6.1``; ``pip install --no-deps ai-dynamo==1.6.1``); ``--dynamo-python``
names its interpreter.  A side's stderr warning lines are printed under its row (kvtune warns there when its
engine runs interpreted).  Figures: benchmarks/fleet/README.md.
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
DYNAMO_PY = Path.home() / ".cache" / "kvtune" / "dynamo-venv" / "bin" / "python"

#: Both sides' engine settings: Dynamo mocker 1.6.1's defaults (python -m dynamo.mocker --help: 16384 blocks,
#: vLLM block size 64, max_num_seqs 256, max_num_batched_tokens 8192, prefix caching and chunked prefill on).
ENGINE = {"num_gpu_blocks": 16384, "block_size": 64, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
          "enable_prefix_caching": True, "enable_chunked_prefill": True}
HASH_BLOCK = 512  # tokens per hash_ids entry (Mooncake)
#: kvtune router name -> Dynamo router_mode.
ROUTERS = {"round_robin": "round_robin", "dynamo_kv": "kv_router"}


# ---- the trace ---------------------------------------------------------------------------------------------------
def write_trace(out: Path, requests: int = 20_000, seed: int = 0, rate: float = 40.0) -> None:
    """A Mooncake-style JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``) with shared
    prefixes: 64 system prompts of 2-8 blocks (Zipf-like popularity), and one request in two continuing one of 2,000
    conversations (its previous prompt's blocks plus 1-2 new ones, capped at 14 blocks, so prompt and output fit Llama-3-8B's 8,192-token context), the rest 1-4 unique
    blocks after the system prompt.  Poisson arrivals at ``rate`` req/s; outputs 32-512 tokens (log-uniform)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    systems = [list(range(s * 8, s * 8 + int(rng.integers(2, 9)))) for s in range(64)]
    weights = 1.0 / np.arange(1, 65)
    weights /= weights.sum()
    next_id = 10_000
    conversations: list[list[int]] = []
    t = 0.0
    with out.open("w") as f:
        for _ in range(requests):
            t += float(rng.exponential(1000.0 / rate))
            if conversations and rng.random() < 0.5:
                c = int(rng.integers(len(conversations)))
                add = int(rng.integers(1, 3))
                hashes = conversations[c] + list(range(next_id, next_id + add))
                next_id += add
                if len(hashes) > 14:  # past 7,168 prompt tokens: a new conversation takes its place
                    hashes = list(systems[int(rng.choice(64, p=weights))])
                conversations[c] = hashes
            else:
                tail = int(rng.integers(1, 5))
                hashes = list(systems[int(rng.choice(64, p=weights))]) + list(range(next_id, next_id + tail))
                next_id += tail
                if len(conversations) < 2000:
                    conversations.append(hashes)
                else:
                    conversations[int(rng.integers(2000))] = hashes
            # The last block is partly filled, as Mooncake's input_length need not be a multiple of 512.
            prompt = (len(hashes) - 1) * HASH_BLOCK + int(rng.integers(1, HASH_BLOCK + 1))
            output = int(np.exp(rng.uniform(np.log(32), np.log(512))))
            f.write(json.dumps({"timestamp": int(t), "input_length": prompt, "output_length": output,
                                "hash_ids": hashes}) + "\n")


# ---- one side ----------------------------------------------------------------------------------------------------
def run_kvtune(trace: Path, workers: int, router: str) -> dict:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    from sim.engine.config import EngineConfig
    from sim.fleet import simulate_fleet
    from sim.profiles import load_gpu, load_model
    from sim.workload import load_trace

    workload = load_trace(trace, "mooncake", hash_block_tokens=HASH_BLOCK)
    config = EngineConfig(num_gpu_blocks_override=ENGINE["num_gpu_blocks"], block_size=ENGINE["block_size"],
                          max_num_seqs=ENGINE["max_num_seqs"], max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
                          enable_prefix_caching=True)  # V1 always chunks prefills
    t1 = time.perf_counter()
    result = simulate_fleet(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"), replicas=workers,
                            router=router, record_steps=False, keep_requests=False)
    t2 = time.perf_counter()
    per_worker = [int(x) for x in result.replicas["requests"]]
    return {"side": "kvtune", "router": router, "workers": workers, "wall_s": t2 - t1, "load_s": t1 - t0,
            "requests": len(workload), "completed": int(result.fleet["finished"]),
            "prefix_reuse_ratio": float(result.fleet["prefix_hit_rate"]), "per_worker": per_worker,
            "makespan_s": float(result.makespan_s)}


def run_dynamo(trace: Path, workers: int, mode: str, per_request: bool) -> dict:
    os.environ.setdefault("RUST_LOG", "error")
    from dynamo.llm import KvRouterConfig  # noqa: F401 - public in ai-dynamo 1.6.1 (dynamo/llm/__init__.py)
    from dynamo.replay import run_trace_replay

    # The mocker's canonical config: {"engine": {...}} (dynamo._core._normalize_mocker_config's shape in 1.6.1).
    engine = {"engine": dict(ENGINE)}
    kwargs = {}
    if mode == "kv_router":
        kwargs["router_config"] = KvRouterConfig(use_kv_events=False, router_ttl_secs=120.0)
    t1 = time.perf_counter()
    report = run_trace_replay([str(trace)], num_workers=workers, router_mode=mode, trace_block_size=HASH_BLOCK,
                              extra_engine_args=engine, capture_per_request=per_request, **kwargs)
    t2 = time.perf_counter()
    summary = report.summary
    out = {"side": "dynamo", "router": mode, "workers": workers, "wall_s": t2 - t1,
           "requests": int(summary["num_requests"]), "completed": int(summary["completed_requests"]),
           "prefix_reuse_ratio": float(summary["prefix_cache_reused_ratio"]),
           "makespan_s": float(summary["duration_ms"]) / 1000.0}
    if per_request:
        counts = [0] * workers
        for row in report.per_request:
            counts[int(row["decode_worker_idx"])] += 1
        out["per_worker"] = counts
    return out


# ---- the paired comparison ---------------------------------------------------------------------------------------
def _whole(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, dict]:
    """Wall seconds of one process and its JSON line, with its CPU seconds (``cpu_s``: user + system, so that a
    wait for the core under load is told apart from work) and its stderr's warning lines (``warnings``: e.g.
    kvtune's engine running interpreted because its build is stale)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True,
                          env={**(os.environ if env is None else env), "RUST_LOG": "error"})
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    info["warnings"] = [line.strip() for line in proc.stderr.splitlines() if "Warning" in line]
    return wall, info


def compare(trace: Path, workers: int, repeats: int, dynamo_py: str, bytecode: bool = True) -> None:
    import tempfile

    from bytecode_cache import kvtune_env

    me = str(Path(__file__).resolve())
    print(f"trace {trace}; {workers} workers; engine {ENGINE}; {repeats} pairs A B per router "
          f"(A: kvtune, B: Dynamo 1.6.1) after one untimed run of each; load average {os.getloadavg()[0]:.1f}")
    # kvtune's modules compiled to bytecode once (by the untimed run), as Dynamo's venv was by pip (bytecode_cache.py)
    cache = tempfile.TemporaryDirectory(prefix="fvd_pycache_")  # removed when compare returns
    a_env = kvtune_env(dict(os.environ), Path(cache.name)) if bytecode else None
    print(f"{'router':<24} {'side':<7} {'proc s':>7} {'cpu s':>6} {'sim s':>7} {'A/B proc':>8} {'reuse':>6} "
          f"{'done':>6}  requests per worker")
    for router, mode in ROUTERS.items():
        a_cmd = [sys.executable, me, "kvtune", str(trace), "--workers", str(workers), "--router", router]
        b_cmd = [dynamo_py, me, "dynamo", str(trace), "--workers", str(workers), "--router", mode]
        rows: dict[str, list] = {"kvtune": [], "dynamo": []}
        _whole(a_cmd, a_env)  # untimed, each side once: bytecode, the page cache, numba's kernel cache
        _whole(b_cmd)
        for _ in range(repeats):
            rows["kvtune"].append(_whole(a_cmd, a_env))
            rows["dynamo"].append(_whole(b_cmd))
        _, dyn_counts = _whole(b_cmd + ["--per-request"])  # per-worker counts (untimed: capture slows it)
        ratios = [a[0] / b[0] for a, b in zip(rows["kvtune"], rows["dynamo"])]
        for side, runs in rows.items():
            info = runs[-1][1]
            per_worker = info.get("per_worker") or dyn_counts.get("per_worker")
            proc = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1]["cpu_s"] for r in runs)
            # In-process: reading the trace and simulating (Dynamo's replay call does both).
            sim = statistics.median(r[1]["wall_s"] + r[1].get("load_s", 0.0) for r in runs)
            ratio = f"{statistics.median(ratios):8.2f}" if side == "kvtune" else f"{'':>8}"
            print(f"{router + ' / ' + mode:<24} {side:<7} {proc:7.2f} {cpu:6.2f} {sim:7.2f} {ratio} "
                  f"{info['prefix_reuse_ratio']:6.3f} {info['completed']:6d}  {per_worker}", flush=True)
            for line in dict.fromkeys(w for r in runs for w in r[1]["warnings"]):
                print(f"{'':<24} {side} warned: {line}", flush=True)
        print(f"{'':<24} A/B whole-process ratios: {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("trace")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=40.0, help="requests per second (Poisson)")
    for name, default in (("kvtune", "round_robin"), ("dynamo", "round_robin")):
        p = sub.add_parser(name)
        p.add_argument("trace", type=Path)
        p.add_argument("--workers", type=int, default=8)
        p.add_argument("--router", default=default)
        p.add_argument("--per-request", action="store_true")
    p = sub.add_parser("compare")
    p.add_argument("trace", type=Path)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dynamo-python", default=str(DYNAMO_PY))
    p.add_argument("--no-bytecode-cache", action="store_true",
                   help="leave PYTHONDONTWRITEBYTECODE as it is for kvtune's side (bytecode_cache.py)")
    opts = parser.parse_args(argv)
    if opts.cmd == "trace":
        write_trace(opts.out, opts.requests, opts.seed, opts.rate)
    elif opts.cmd in ("kvtune", "dynamo"):
        if opts.cmd == "kvtune":
            print(json.dumps(run_kvtune(opts.trace, opts.workers, opts.router)))
        else:
            print(json.dumps(run_dynamo(opts.trace, opts.workers, opts.router, opts.per_request)))
        # Both sides exit as the kvtune program does (optimizer/cli.py): no full collections over every object
        # left at exit (~1 of 11.8 s wall of the round-robin kvtune side under load; Dynamo's heap is small).
        import gc

        gc.freeze()
    else:
        compare(opts.trace, opts.workers, opts.repeats, opts.dynamo_python, not opts.no_bytecode_cache)


if __name__ == "__main__":
    main()
