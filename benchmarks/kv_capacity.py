"""KV-cache capacity against vLLM's own start-up logs (benchmarks/data/vllm_kv_capacity.yaml).

For each published run, kvtune's ``size_kv_cache`` (sim/engine/sizing.py) predicts vLLM's "Available KV cache
memory" and "GPU KV cache size" (tokens = blocks x block size) for the same model, GPU, TP, dtypes, utilization
and vLLM release; the table prints both with the relative error and the terms of the prediction.  Target: every
run within +-2%.

    PYTHONPATH=. python benchmarks/kv_capacity.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from sim.engine.config import EngineConfig
from sim.engine.sizing import GIB, size_kv_cache
from sim.profiles import load_gpu, load_model
from sim.safe_yaml import read_yaml

DATA = Path(__file__).resolve().parent / "data" / "vllm_kv_capacity.yaml"


def predict(run: dict):
    model = load_model(run["model"])
    gpu = load_gpu(run["gpu"])
    if "total_gib" in run:  # the run's own device total, when its log printed a different one
        gpu = dataclasses.replace(gpu, vllm_total_gib=float(run["total_gib"]))
    knobs = {"flavor": run.get("flavor", "vllm-v1"), "engine_version": run["vllm"], "tensor_parallel_size": run["tp"],
             "gpu_memory_utilization": run["util"], "max_model_len": run["max_model_len"],
             "kv_cache_dtype": run.get("kv_cache_dtype", "auto")}
    if run.get("quantization"):
        knobs["quantization"] = run["quantization"]
    if knobs["flavor"] == "vllm-v1":
        knobs["enable_prefix_caching"] = False
    config = EngineConfig.from_dict(knobs, "run").resolve(model.max_model_len, gpu)
    return size_kv_cache(model, gpu, config), config


def rows() -> list[dict]:
    out = []
    for run in read_yaml(DATA)["runs"]:
        sizing, config = predict(run)
        kv = sizing.available_kv_bytes / GIB
        tokens = sizing.num_gpu_blocks * config.block_size
        out.append({
            "run": f"{run['model']} TP{run['tp']}" + (f" {run['quantization']}" if run.get("quantization") else "")
                   + (f" kv-{run['kv_cache_dtype']}" if run.get("kv_cache_dtype") else "") + f" (vLLM {run['vllm']})",
            "kv_gib": kv, "kv_pub": run["kv_gib"], "kv_err": kv / run["kv_gib"] - 1,
            "tokens": tokens, "tokens_pub": run.get("tokens"),
            "tokens_err": (tokens / run["tokens"] - 1) if run.get("tokens") else None,
            "terms": f"w {sizing.weight_bytes / GIB:.2f} act {sizing.activation_bytes / GIB:.2f} "
                     f"nt {sizing.non_torch_bytes / GIB:.2f} cg {sizing.cudagraph_bytes / GIB:.2f}",
        })
    return out


def main() -> int:
    table = rows()
    print(f"{'run':<42} {'kvtune GiB':>10} {'vLLM GiB':>9} {'err':>7} {'kvtune tok':>11} {'vLLM tok':>10} {'err':>7}  terms (GiB)")
    for r in table:
        tok_pub = f"{r['tokens_pub']:,}" if r["tokens_pub"] else "-"
        tok_err = f"{r['tokens_err']:+.2%}" if r["tokens_err"] is not None else "-"
        print(f"{r['run']:<42} {r['kv_gib']:>10.2f} {r['kv_pub']:>9.2f} {r['kv_err']:>+7.2%} {r['tokens']:>11,} "
              f"{tok_pub:>10} {tok_err:>7}  {r['terms']}")
    worst = max(abs(r["kv_err"]) for r in table)
    within = sum(abs(r["kv_err"]) <= 0.02 for r in table)
    print(f"\n{within}/{len(table)} runs within +-2% of vLLM's Available KV cache memory; worst {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
