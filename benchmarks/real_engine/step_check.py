"""The latency model against an engine's own steps (issue 32): per logged step, the profile's duration for a step
of that shape over the measured one, on any run whose engine logged its steps (``kvtune calibrate --launch vllm``
has it do so; for a replay, start vLLM with ``--enable-logging-iteration-details`` and ``VLLM_LOGGING_CONFIG_PATH``
set as ``replay.calibration.step_log.logging_env`` sets it).  No simulation of the run: the steps' shapes are the
engine's, so what differs is the step time alone.

Prints, per log: the simulated over the measured total time of the steps (what the run's throughput follows) and
the median error per kind of step (decode-only, prefill and decode, prefill only) and batch size.

    python benchmarks/real_engine/step_check.py --profile P --model MODEL_DIR \\
        --set block_size=32 --set max_model_len=512 --set num_gpu_blocks_override=48 --set max_num_seqs=128 \\
        RUN_DIR/engine.log [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from optimizer import add_engine_arguments, add_latency_arguments  # noqa: E402
from replay.calibration.step_log import (after_idle, log_errors, prefilling, read_steps, step_shapes,  # noqa: E402
                                         step_targets)
from replay.engine_options import engine_config  # noqa: E402
from sim.engine import resolve_engine, roofline_for  # noqa: E402
from sim.errors import ConfigError  # noqa: E402
from sim.latency import read_profile  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402

BATCHES = [0, 1, 4, 8, 16, 32, 64, 128, 1024]


def check(log: Path, profile: Path, model, gpu, config) -> dict:
    """The comparison of one engine log (see the module docstring) as a dict; prints nothing."""
    prof = read_profile(profile)
    plan = resolve_engine(config, model, gpu)
    latency = roofline_for(plan.config, model, gpu, prof.coefficients)
    steps = read_steps(log)
    if steps.empty:
        raise ConfigError(str(log), "no engine step lines (was vLLM started with --enable-logging-iteration-details?)")
    targets = step_targets(steps)
    shapes = step_shapes(steps, plan.sizing.num_gpu_blocks, int(plan.config.block_size))
    prefills = prefilling(shapes)
    credit = after_idle(steps) * prefills * prof.coefficients.per_prefill_seq_overhead_s
    r, total_sim, total_meas = log_errors(targets, shapes, latency, credit)
    keep = np.isfinite(targets) & (targets > 0)
    rows = steps[keep].copy()
    rows["err"] = np.expm1(r)
    rows["kind"] = np.where(rows["prefill_seqs"] > 0, np.where(rows["decode_seqs"] > 0, "prefill+decode", "prefill"),
                            "decode")
    rows["batch"] = pd.cut(rows["prefill_seqs"] + rows["decode_seqs"], BATCHES)
    table = rows.groupby(["kind", "batch"], observed=True).agg(
        steps=("err", "size"), median_err=("err", "median"), measured_ms=("cycle_s", lambda s: 1e3 * s.median()))
    return {"log": str(log), "steps": int(keep.sum()), "busy_steps": int(steps["cycle_s"].notna().sum()),
            "total_ratio": total_sim / total_meas,
            # The measured time the model leaves unexplained, per sequence prefilled (the host work per request).
            "gap_per_prefill_s": (total_meas - total_sim) / max(1.0, float(prefills[keep].sum())), "median_err": float(np.median(np.expm1(r))), "table": table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path, help="engine logs with vLLM's step lines")
    add_latency_arguments(ap, profile_help="the latency profile (kvtune calibrate)", coef=False, required=True)
    add_engine_arguments(ap, model_help="the HF model folder the engine served", gpu_help="device (default: the "
                         "profile's)", set_help="the engine's config (repeatable), as it was started")
    args = ap.parse_args(argv)
    try:
        args.profile = Path(args.profile)
        prof = read_profile(args.profile)
        model = load_model(args.model, field="--model")
        gpu = load_gpu(args.gpu or prof.gpu or "vllm-cpu-1core", field="--gpu")
        config = engine_config(args.set)
        results = [check(log, args.profile, model, gpu, config) for log in args.logs]
    except (ConfigError, OSError) as exc:
        print(f"step_check.py: {exc}", file=sys.stderr)
        return 2
    for res in results:
        print(f"{res['log']}: {res['steps']} steps ({res['busy_steps']} busy): simulated / measured total "
              f"{res['total_ratio']:.3f}, median step error {res['median_err']:+.1%}, measured - simulated per "
              f"prefilled sequence {1e3 * res['gap_per_prefill_s']:+.2f} ms")
        print(res["table"].to_string(float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
