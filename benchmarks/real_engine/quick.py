"""The fidelity benchmark's quick mode (``run.py --quick``, CI): 3 configs, the ``reasoning-burst`` workload, 2
repeats; with ``--calibrate`` the engine of the first config first replays ``kvtune calibrate --quick``'s probes and
the profile fitted to them predicts every run (``<out>/quick-profile.yaml``).  :func:`quick_checks` asserts what
cannot flake: the scarce cache preempts and the ample one does not, two configs far apart order by tokens per
engine CPU second, and with ``--calibrate`` the accuracy bound :data:`QUICK_BAND` (:func:`quick_accuracy`)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, ahead of an installed kvtune
from bench_config import BenchConfig, predicted_metrics  # noqa: E402
from matrix import (QUICK_CONFIGS, QUICK_WORKLOAD, config_by_name, dedicated_coefficients,  # noqa: E402
                    measured_metrics, run_dir, simulate_run)
from workloads import WORKLOADS  # noqa: E402

from replay.calibrate import ClientLatency, at_cpu_share, cpu_share  # noqa: E402
from replay.results import ReplayResult  # noqa: E402
from sim.latency import read_profile  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402
from sim.runner import simulate  # noqa: E402


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
    dedicated = dedicated_coefficients(profile, prof)
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
