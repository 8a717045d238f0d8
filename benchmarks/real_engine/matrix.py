"""The real-engine matrix's configs and runs: which configs replay which workloads, measuring them on vLLM (one
engine start per config, or per config and repeat with ``--interleave``), and each run's measured and predicted
metrics.  ``run.py`` (the reports and the command line), ``quick.py`` (the CI quick mode) and ``closed_loop.py``
import it; it imports neither."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, ahead of an installed kvtune
from bench_config import BenchConfig, predicted_metrics, table_metrics  # noqa: E402
from workloads import SCALE_REQUESTS, SCALE_WORKLOADS, build  # noqa: E402

from replay.calibrate import ClientLatency, contended_share, engine_times, record_engine_times, with_client_latency  # noqa: E402
from replay.calibration.step_log import ITERATION_LOG_FLAG, logging_env, read_steps  # noqa: E402
from replay.flags import serve_command  # noqa: E402
from replay.launcher import EngineProcess  # noqa: E402
from replay.loadgen import ReplayOptions, replay  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.latency import with_client_timeouts  # noqa: E402
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
    doc = study_record(out, scale=False)
    if doc is None:
        return None
    rec = doc["recommended"]
    base = config_by_name(CLOSED_LOOP_BASELINE)
    return BenchConfig("recommended", int(rec["max_num_seqs"]), int(rec["max_num_batched_tokens"]),
                       base.num_gpu_blocks, base.prefix_caching, base.workloads)


def study_record(out: Path, scale: bool = True) -> dict | None:
    """What ``closed_loop.py study`` wrote in ``out``: ``recommended-scale.json`` (``--scale``) or
    ``recommended.json``; None where the study has not run."""
    path = Path(out) / ("recommended-scale.json" if scale else "recommended.json")
    return json.loads(path.read_text()) if path.is_file() else None


def export_within_noise(out: Path) -> bool | None:
    """Whether the study's export called its predicted throughput gain over the default within the engine's
    run-to-run spread (``closed_loop.py study --scale`` keeps the export's ``robustness`` verdict in
    ``<out>/recommended-scale.json``); None where it was not recorded (a study made before the export said it)."""
    doc = study_record(out)
    verdict = None if doc is None else doc.get("export_within_noise")
    return None if verdict is None else bool(verdict)


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
    doc = study_record(out)
    if doc is None:
        return configs
    rec = doc["recommended"]
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


# ---- the latency profile ------------------------------------------------------------------------------------
def profile_fit(path) -> dict:
    """The profile's ``fit`` section (what the calibration measured beside the coefficients)."""
    return (read_yaml(path) or {}).get("fit", {})


def profile_device(path) -> object:
    """What the profile says about the machine it was fitted on (None when it records nothing)."""
    doc = read_yaml(path) or {}
    return doc.get("device") or (doc.get("fit") or {}).get("device")


#: ``raw``: the profile as fitted, at the CPU share the engine had during calibration (the machine as loaded as
#: then); ``normalized``: at the share the engine had in the run itself (its worker's CPU seconds over the run's
#: span, the measure the calibration used), which takes other jobs' load out of the comparison on a loaded machine.
#: A profile that records no calibration share gets ``raw`` only (:func:`prediction_modes`).
MODES = ("raw", "normalized")


def prediction_modes(path) -> tuple[tuple[str, ...], dict[str, str]]:
    """The prediction modes a profile supports, and why any other is left out.  ``raw`` always; ``normalized``
    (at each run's CPU share) only when the fit recorded the share the engine had while calibrated
    (``cpu_share_median``): its dedicated-core coefficients are then what a run's share scales.  A profile fitted
    to the engine's logged steps records none, its coefficients being the engine as it ran; scaling them by a run's
    share counts the machine's load twice (2026-12-07, measurements/epyc-inter-*: normalized predicted
    throughput 3-33% below raw in every cell, E2E p50/p99 error 19%/13% against raw's 9%/8%)."""
    share = profile_fit(path).get("cpu_share_median")
    if isinstance(share, (int, float)) and share == share and share > 0:
        return MODES, {}
    return ("raw",), {"normalized": "the profile records no calibration CPU share (fitted to the engine's logged "
                                    "steps, or not by kvtune calibrate): its coefficients already hold the load the "
                                    "engine ran under, and a run's share would count it twice"}


def dedicated_coefficients(path, prof):
    """The profile's coefficients on a core of the engine's own (its fit's ``dedicated_core_coefficients``, which
    ``at_cpu_share`` scales to a run's CPU share); the coefficients as fitted when the fit recorded none."""
    from sim.latency import coefficients_from_mapping

    dedicated = profile_fit(path).get("dedicated_core_coefficients")
    return coefficients_from_mapping(dedicated) if dedicated else prof.coefficients
