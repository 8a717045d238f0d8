"""The reasoning-traffic incident as the runs show it: load up, preemptions per request up, a cohort's p99 up.

The workload of studies/reasoning-kv-pressure.yaml (ServeGen DeepSeek-R1 client 35; Llama-3-8B on one L40S) at
vLLM 0.33's defaults for the GPU (``sim.engine.defaults``: max_num_batched_tokens 2048, max_num_seqs 256, async
scheduling on for an L40S), at rising rates, next to the same engine with twice the KV blocks (the "ample KV"
reference).  Prints per run: preemptions per request (mean, p99,
max, share >= 2), p99 E2E and TTFT of the short and long classes and of the preempted cohorts, GPU busy share,
busy time by what it served against the token shares, queue and resume waits, and who the victims are.

    python benchmarks/reasoning_kv_pressure.py [--rates 0.04,0.055,0.065,0.07,0.075] [--spec studies/reasoning-kv-pressure.yaml]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from objectives import summarize
from optimizer import load_study_spec
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate

def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="studies/reasoning-kv-pressure.yaml")
    ap.add_argument("--rates", default="0.04,0.055,0.065,0.07,0.075", help="rate_scale values (the study uses 0.07)")
    args = ap.parse_args()
    spec = load_study_spec(args.spec)
    base_scale = spec.workload.rate_scale
    base = spec.workload.build(spec.workload.seed)
    model, gpu = load_model(spec.model), load_gpu(spec.gpu)
    resolved = EngineConfig().resolve(model.max_model_len, gpu)
    print(f"{spec.model} on {gpu.name}, {len(base)} requests ({base.source}); engine defaults: max_num_batched_tokens "
          f"{resolved.max_num_batched_tokens}, max_num_seqs {resolved.max_num_seqs}, async_scheduling "
          f"{resolved.async_scheduling}\n")
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        workload = base.scale_rate(rate / base_scale)
        for label, extra in (("defaults", {}), ("2x KV", {"double": True})):
            knobs: dict = {}
            if extra:
                blocks = simulate(workload.head(1), EngineConfig(**knobs), model, gpu).sizing.num_gpu_blocks
                knobs["num_gpu_blocks_override"] = 2 * blocks
            t0 = time.process_time()
            result = simulate(workload, EngineConfig(**knobs), model, gpu)
            cpu = time.process_time() - t0
            s = summarize(result.requests, result.steps, workload.classes)
            d = s.to_dict()
            req = result.requests
            preempted = req["num_preemptions"] > 0
            rows.append((rate, label, s, d, req, preempted, cpu))
    print("| rate | KV | preempt/req mean / p99 / max | preempted >=2 | short p99 E2E / TTFT (s) | long p99 E2E (s) |"
          " GPU busy | recompute: time / tokens | queue wait p99 (s) | resume wait p99 (s) | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rate, label, s, d, req, preempted, cpu in rows:
        print(f"| {rate:g} | {label} | {d['preemptions_per_request.mean']:.2f} / {d['preemptions_per_request.p99']:.0f}"
              f" / {d['preemptions_per_request.max']:.0f} | {_pct(d['preemptions_per_request.share_ge2'])}"
              f" | {d['class.short.e2e_s.p99']:.0f} / {d['class.short.ttft_s.p99']:.0f}"
              f" | {d['class.long.e2e_s.p99']:.0f} | {_pct(d['busy_fraction'])}"
              f" | {_pct(d['recompute_busy_share'])} / {_pct(d['recompute_token_share'])}"
              f" | {d['all.queue_wait_s.p99']:.0f} | {d['all.resume_wait_s.p99']:.0f} | {cpu:.1f} |")
    print("\nBusy time by what it served (share of busy time) and where preempted requests lost their time:\n")
    print("| rate | KV | new prefill | recompute | decode | transfer | overhead | preempted requests: stall s "
          "(sum) | of which recompute s | victims' output tokens (median) vs never preempted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate, label, s, d, req, preempted, cpu in rows:
        t = s.steps.time
        stall = float(req.loc[preempted, "preempted_s"].sum())
        recompute = float(req.loc[preempted, "time_recompute_s"].sum())
        victims = float(np.median(req.loc[preempted, "output_tokens_target"])) if preempted.any() else float("nan")
        others = float(np.median(req.loc[~preempted, "output_tokens_target"]))
        print(f"| {rate:g} | {label} | {_pct(t.share('prefill_new'))} | {_pct(t.share('recompute'))} | "
              f"{_pct(t.share('decode'))} | {_pct(t.share('transfer'))} | {_pct(t.share('overhead'))} | {stall:.0f} | "
              f"{recompute:.0f} | {victims:.0f} vs {others:.0f} |")
    print("\np99 E2E (s) by preemption count (requests in the cohort):\n")
    labels = list(rows[0][2].preemption_buckets)
    print("| rate | KV | " + " | ".join(f"preempted {b}" for b in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for rate, label, s, d, req, preempted, cpu in rows:
        cells = [f"{c.e2e_s.p99:.0f} ({c.counts.total})" if c.counts.total else "-" for c in s.preemption_buckets.values()]
        print(f"| {rate:g} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
