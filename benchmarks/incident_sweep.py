"""The KV-pressure incident as a table: max_num_seqs x reserved KV fraction on a nearly full cache.

Llama-3-8B on one L40S, the first 4,000 requests of the bundled Azure 2023 conversation trace at 1.25x its
arrival rate (the cache runs ~90% full).  Prints, per config: recompute share, preemptions, new-token busy
share, p99 E2E per class, timed-out count (class timeout 120 s) and output tokens/s.

    python benchmarks/incident_sweep.py [--requests 4000] [--rate-scale 1.25] [--model Llama-3-8B] [--gpu L40S]
        [--set knob=value ...]

``--set`` changes an engine knob under every config of the sweep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from objectives import summarize
from optimizer import add_engine_arguments, add_rate_scale_argument, parse_pairs
from sim.engine.config import EngineConfig
from sim.errors import KvtuneError
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload import RequestClass, bundled_trace_path, load_trace


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    add_rate_scale_argument(ap, default=1.25)
    add_engine_arguments(ap, model_help="model profile or HF folder (default Llama-3-8B)",
                         gpu_help="GPU profile or device YAML (default L40S)",
                         set_help="engine knob under every config of the sweep (repeatable)")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    try:
        sweep(args)
    except KvtuneError as exc:  # bad input: one line, exit 2
        print(f"incident_sweep: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def sweep(args: argparse.Namespace) -> None:
    knobs = parse_pairs(args.set, "--set")
    EngineConfig.from_dict(knobs, "--set")  # a bad knob is the one error line before any output
    model = load_model(args.model or "Llama-3-8B", field="--model")
    gpu = load_gpu(args.gpu or "L40S", field="--gpu")
    base = load_trace(bundled_trace_path()).head(args.requests).scale_rate(args.rate_scale)
    classes = {name: RequestClass(name, timeout_s=args.timeout_s) for name in base.classes}
    workload = type(base)(requests=base.requests, classes=classes, source=base.source)
    print(f"{model.name} on {gpu.name}, {len(workload)} requests of {Path(workload.source).name} at {args.rate_scale}x, "
          f"client timeout {args.timeout_s:.0f} s\n")
    header = "| max_num_seqs | reserved | recompute share | preemptions | new-token busy | p99 E2E s (conv) | timed out | output tok/s |"
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    for max_num_seqs in (32, 64, 128, 256, 512):
        for reserved in (0.0, 0.1, 0.2):
            config = EngineConfig.from_dict({**knobs, "max_num_seqs": max_num_seqs,
                                             "reserved_kv_fraction": reserved}, "--set")
            result = simulate(workload, config, model, gpu)
            s = summarize(result.requests, result.steps, workload.classes).to_dict()
            p99 = " / ".join(f"{s[f'class.{c}.e2e_s.p99']:.1f}" for c in workload.classes)
            print(f"| {max_num_seqs} | {reserved:.1f} | {s['recompute_token_share']:.4f} | {int(s['preemptions_total'])} | "
                  f"{s['new_token_busy_share']:.4f} | {p99} | {int(s['all.count.timed_out'])} | {s['output_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
