"""Peer speed: kvtune simulate against Vidur (PyPI vidur==0.0.26) on the same trace, whole process, A B A B (issue 34).

Both sides simulate Llama-2-70B with tensor parallelism 2 on A100s (the one model Vidur's public profiles can run
offline: ../shared/tools/vidur/README.md), the vLLM scheduler without chunked prefill, 2,569 KV blocks of 16
tokens, at most 128 sequences and 4,096 tokens a step, on the bundled Azure 2023 conversation trace (19,366
requests) at its own rate (1x), each request's prompt cut so that prompt + output <= 4,096 tokens (Vidur's
predictor grid; 1,612 requests are cut).  kvtune: ``python -m optimizer.cli simulate --flavor vllm-v0 ...``
(``--flavor vllm-v1`` for its V1 scheduler); Vidur: ``time_vidur.py`` from ../shared/tools/vidur (``python -m
vidur.main`` plus phase timings), with the restart patch (0.0.26 asserts on any preemption otherwise).

Each run is a fresh process; its wall seconds, user+sys CPU seconds and peak RSS are the operating system's
(``os.wait4``).  kvtune's modules are compiled to bytecode once, by its warm-up run, as Vidur's were by ``pip
install`` (``bytecode_cache.py``, measured by ``whole_process.py``; ``--no-bytecode-cache``: as the environment has
it).  One warm-up run of each side, then ``--pairs`` pairs in the order A (kvtune) B (Vidur) A B ...; the ratio
is Vidur's figure over kvtune's, pair by pair.  Vidur needs its predictors trained once per (profiles, TP, block
size, grid), cached in ``--vidur-cache`` (make it with ../shared/tools/vidur/make_vidur_hf_cache.py and
run vidur_direct.sh once with the same grid): ~16.5 min on 2 quiet cores with Vidur's default grid of 27 random
forests per operator, much less with ``--forest`` one point (the default: 500 trees, depth 16, split 2, the point
the full grid picked for the first operator it trained here).  The grid changes the predictions' fit, not the
event loop's cost: Vidur tabulates every operator's predicted time over its grid once, before the loop, and looks
them up while simulating.

    python benchmarks/vs_vidur.py --vidur-python VENV/bin/python --vidur-cache CACHE [--pairs 3] [--flavor vllm-v0]
                                  [--forest 500,16,2] [--no-vidur-warmup] [--max-requests N] [--no-bytecode-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bytecode_cache import kvtune_env

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT.parent / "shared" / "tools" / "vidur"
MAX_TOKENS = 4096
BLOCKS = 2569
MAX_SEQS = 128


def write_traces(folder: Path, max_requests: int | None) -> tuple[Path, Path, int]:
    import pandas as pd

    df = pd.read_csv(ROOT / "sim" / "data" / "azure_conv_2023.csv.gz")
    if max_requests:
        df = df.head(max_requests)
    out = df.output_tokens.clip(lower=1, upper=MAX_TOKENS - 1)
    prompt = pd.concat([df.prompt_tokens.clip(lower=1), MAX_TOKENS - out], axis=1).min(axis=1)
    kv = folder / "trace.csv"
    pd.DataFrame({"arrival_s": df.arrival_s, "prompt_tokens": prompt, "output_tokens": out}).to_csv(kv, index=False)
    vidur = folder / "trace_vidur.csv"  # vidur 0.0.26 trace_replay: Azure-style columns, rows of one Date
    pd.DataFrame({"Date": "2023-08-21", "Time": df.arrival_s, "PromptTokenCount": prompt,
                  "CompletionTokenCount": out}).to_csv(vidur, index=False)
    return kv, vidur, len(df)


def kvtune_cmd(trace: Path, out: Path, flavor: str) -> list[str]:
    return [sys.executable, "-m", "optimizer.cli", "simulate", "--trace", str(trace), "--model", "Llama-2-70B",
            "--gpu", "A100", "--tp", "2", "--flavor", flavor, "--set", f"max_num_seqs={MAX_SEQS}",
            "--set", f"max_num_batched_tokens={MAX_TOKENS}", "--set", f"num_gpu_blocks_override={BLOCKS}",
            "--set", f"max_model_len={MAX_TOKENS}", "--out", str(out)]


def vidur_cmd(python: str, cache: str, trace: Path, out: Path, forest: str = "full", tools: Path = TOOLS) -> list[str]:
    pfx = "random_forrest_execution_time_predictor_config"
    grid = []
    if forest != "full":  # one point of the random forests' grid (num_estimators, max_depth, min_samples_split)
        trees, depth, split = forest.split(",")
        grid = [f"--{pfx}_num_estimators", trees, f"--{pfx}_max_depth", depth, f"--{pfx}_min_samples_split", split]
    return [python, str(tools / "time_vidur.py"), *grid,
            "--replica_config_model_name", "meta-llama/Llama-2-70b-hf", "--replica_config_device", "a100",
            "--replica_config_network_device", "a100_dgx", "--replica_config_tensor_parallel_size", "2",
            "--replica_config_num_pipeline_stages", "1", "--cluster_config_num_replicas", "1",
            "--global_scheduler_config_type", "round_robin", "--replica_scheduler_config_type", "vllm",
            "--vllm_scheduler_config_batch_size_cap", str(MAX_SEQS),
            "--vllm_scheduler_config_max_tokens_in_batch", str(MAX_TOKENS), "--cache_config_block_size", "16",
            "--cache_config_watermark_blocks_fraction", "0.01", "--cache_config_num_blocks", str(BLOCKS),
            "--request_generator_config_type", "trace_replay", "--trace_request_generator_config_trace_file",
            str(trace), "--trace_request_generator_config_date", "2023-08-21",
            "--trace_request_generator_config_prefill_scale_factor", "1",
            "--trace_request_generator_config_decode_scale_factor", "1",
            "--trace_request_generator_config_time_scale_factor", "1",
            "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            "--execution_time_predictor_config_type", "random_forrest",
            f"--{pfx}_model_profiling_dataset", "local/llama-2-70b-a100",
            f"--{pfx}_network_profiling_dataset", "local/a100-dgx", f"--{pfx}_cache_dir", cache,
            f"--{pfx}_prediction_max_tokens_per_request", str(MAX_TOKENS),
            f"--{pfx}_prediction_max_batch_size", str(MAX_SEQS), "--metrics_config_output_dir", str(out / "sim"),
            "--metrics_config_store_token_completion_metrics", "--no-metrics_config_store_plots",
            "--no-metrics_config_enable_chrome_trace"]


def timed(cmd: list[str], env: dict, cwd: Path, log: Path) -> dict:
    """One whole process: wall, user+sys CPU and peak RSS from the operating system."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed (rc {proc.returncode}):\n" + log.read_text()[-3000:])
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_mb": ru.ru_maxrss / 1024}


def run_kvtune(trace: Path, folder: Path, flavor: str, n: int, bytecode: bool = True) -> dict:
    out = folder / f"kv{n}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if bytecode:  # compiled once, as Vidur's venv was by pip (bytecode_cache.py)
        env = kvtune_env(env, folder / "pycache")
    r = timed(kvtune_cmd(trace, out, flavor), env, ROOT, folder / f"kv{n}.log")
    summary = json.loads((out / "summary.json").read_text())
    r["sim_req_per_wall_s"] = summary.get("simulated_requests_per_wall_s")
    r["makespan_s"] = summary.get("metrics", {}).get("makespan_s")
    return r


def run_vidur(python: str, cache: str, trace: Path, folder: Path, n: int, forest: str, tools: Path) -> dict:
    out = folder / f"vidur{n}"
    out.mkdir()
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "VIDUR_PATCH_RESTART": "1"}
    log = folder / f"vidur{n}.log"
    r = timed(vidur_cmd(python, cache, trace, out, forest, tools), env, out, log)
    line = next((ln for ln in log.read_text().splitlines() if ln.startswith("TIMING ")), None)
    if line:
        t = json.loads(line[len("TIMING "):])
        r["event_loop_s"] = t["event_loop_s"]
        r["makespan_s"] = t["sim_time_s"]
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vidur-python", required=True, help="python of a venv with vidur==0.0.26")
    p.add_argument("--vidur-cache", required=True, help="Vidur's predictor cache + offline profile datasets")
    p.add_argument("--vidur-tools", type=Path, default=TOOLS, help="folder of time_vidur.py (default %(default)s)")
    p.add_argument("--pairs", type=int, default=3, help="counted A B pairs, after one warm-up run of each")
    p.add_argument("--no-vidur-warmup", action="store_true",
                   help="warm up kvtune only (one run), not Vidur: its training run just read its caches")
    p.add_argument("--flavor", default="vllm-v0", choices=["vllm-v0", "vllm-v1"], help="kvtune's scheduler")
    p.add_argument("--forest", default="500,16,2",
                   help="Vidur's random-forest grid: one point 'trees,depth,split' (its predictors train ~27x faster "
                        "than on the full grid) or 'full' (Vidur's default 3x3x3 grid)")
    p.add_argument("--max-requests", type=int, default=None, help="the first N requests of the trace (default all)")
    p.add_argument("--no-bytecode-cache", action="store_true",
                   help="leave PYTHONDONTWRITEBYTECODE as it is: where it is set, every kvtune run compiles its "
                        "modules from source (by default they are compiled once, bytecode_cache.py)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="vs_vidur_") as tmp:
        folder = Path(tmp)
        kv_trace, vidur_trace, n_req = write_traces(folder, args.max_requests)
        print(f"{n_req} requests; kvtune --flavor {args.flavor}; load average {os.getloadavg()[0]:.1f}", flush=True)
        rows = []
        bytecode = not args.no_bytecode_cache
        if args.no_vidur_warmup:  # Vidur's caches were just read by its training run; kvtune's kernels warm once
            run_kvtune(kv_trace, folder, args.flavor, 99, bytecode)
        for i in range(1 if args.no_vidur_warmup else 0, args.pairs + 1):
            a = run_kvtune(kv_trace, folder, args.flavor, i, bytecode)
            b = run_vidur(args.vidur_python, args.vidur_cache, vidur_trace, folder, i, args.forest, args.vidur_tools)
            pair = {"pair": "warm-up" if i == 0 else i, "kvtune": a, "vidur": b,
                    "wall_ratio": b["wall_s"] / a["wall_s"], "cpu_ratio": b["cpu_s"] / a["cpu_s"],
                    "load": os.getloadavg()[0]}
            print(json.dumps(pair, default=lambda v: round(v, 3)), flush=True)
            if i:
                rows.append(pair)
    print()
    print("| pair | kvtune wall s / CPU s / peak MB | Vidur wall s / CPU s / peak MB (event loop s) "
          "| Vidur/kvtune wall | Vidur/kvtune CPU | load |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["kvtune"], r["vidur"]
        print(f"| {r['pair']} | {a['wall_s']:.2f} / {a['cpu_s']:.2f} / {a['peak_mb']:.0f} | {b['wall_s']:.1f} / "
              f"{b['cpu_s']:.1f} / {b['peak_mb']:.0f} ({b.get('event_loop_s', float('nan')):.1f}) "
              f"| {r['wall_ratio']:.1f}x | {r['cpu_ratio']:.1f}x | {r['load']:.1f} |")
    if rows:
        print(f"median: {statistics.median(r['wall_ratio'] for r in rows):.1f}x wall, "
              f"{statistics.median(r['cpu_ratio'] for r in rows):.1f}x CPU; simulated makespan kvtune "
              f"{rows[-1]['kvtune']['makespan_s']:.0f} s, Vidur {rows[-1]['vidur'].get('makespan_s', float('nan')):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
