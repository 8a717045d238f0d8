"""The KV-pressure incident as a table: max_num_seqs x reserved KV fraction on a nearly full cache.

Llama-3-8B on one L40S, the first 4,000 requests of the bundled Azure 2023 conversation trace at 1.25x its
arrival rate (the cache runs ~90% full).  Prints, per config: recompute share, preemptions, new-token busy
share, p99 E2E per class, timed-out count (class timeout 120 s) and output tokens/s.

    python benchmarks/incident_sweep.py [--requests 4000] [--rate-scale 1.25] [--gpu L40S]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from objectives import summarize
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload import RequestClass, bundled_trace_path, load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rate-scale", type=float, default=1.25)
    ap.add_argument("--gpu", default="L40S")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args()
    base = load_trace(bundled_trace_path()).head(args.requests).scale_rate(args.rate_scale)
    classes = {name: RequestClass(name, timeout_s=args.timeout_s) for name in base.classes}
    workload = type(base)(requests=base.requests, classes=classes, source=base.source)
    model, gpu = load_model("Llama-3-8B"), load_gpu(args.gpu)
    print(f"Llama-3-8B on {gpu.name}, {len(workload)} requests of {Path(workload.source).name} at {args.rate_scale}x, "
          f"client timeout {args.timeout_s:.0f} s\n")
    header = "| max_num_seqs | reserved | recompute share | preemptions | new-token busy | p99 E2E s (conv) | timed out | output tok/s |"
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    for max_num_seqs in (32, 64, 128, 256, 512):
        for reserved in (0.0, 0.1, 0.2):
            config = EngineConfig(max_num_seqs=max_num_seqs, reserved_kv_fraction=reserved)
            result = simulate(workload, config, model, gpu)
            s = summarize(result.requests, result.steps, workload.classes).to_dict()
            p99 = " / ".join(f"{s[f'class.{c}.e2e_s.p99']:.1f}" for c in workload.classes)
            print(f"| {max_num_seqs} | {reserved:.1f} | {s['recompute_token_share']:.4f} | {int(s['preemptions_total'])} | "
                  f"{s['new_token_busy_share']:.4f} | {p99} | {int(s['all.count.timed_out'])} | {s['output_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
