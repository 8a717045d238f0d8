"""The latency model against an engine's own steps (issue 32): per logged step, the profile's duration for a step
of that shape over the measured one, on any run whose engine logged its steps (``kvtune calibrate --launch vllm``
has it do so; for a replay, start vLLM with ``--enable-logging-iteration-details`` and ``VLLM_LOGGING_CONFIG_PATH``
set as ``replay.calibration.step_log.logging_env`` sets it).  No simulation of the run: the steps' shapes are the
engine's, so what differs is the step time alone.

Prints, per log: the simulated over the measured total time of the steps (what the run's throughput follows) and
the median error per kind of step (decode-only, prefill and decode, prefill only) and batch size.

With ``--measured`` it reads no profile: per folder of saved probe runs (``kvtune calibrate``'s, each run's
``engine_steps.parquet``), the median measured ``cycle_s`` of the decode-only steps by batch size, as one markdown
row per folder (how the engine's own step cost moves with its config, or from one probe session to the next):

    python benchmarks/real_engine/step_check.py --measured runs/epyc/q-s16-l512 runs/epyc/q-s128-l512 [...]

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
#: ``--measured``'s batch-size columns: ``(label, low, high)``, inclusive.
MEASURED_BATCHES = [("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), ("9-16", 9, 16), ("17-32", 17, 32), ("33-64", 33, 64)]


def measured_cycles(folder: Path) -> dict[str, tuple[float, int]]:
    """Per ``MEASURED_BATCHES`` label: the median ``cycle_s`` (ms) of the decode-only steps of every run under
    ``folder`` (a run folder or a folder of them, each with ``engine_steps.parquet``) and how many steps."""
    files = sorted(folder.glob("engine_steps.parquet")) or sorted(folder.glob("*/engine_steps.parquet"))
    if not files:
        raise ConfigError(str(folder), "no engine_steps.parquet in it or in its run folders (kvtune calibrate "
                                       "--launch vllm saves one per probe run)")
    steps = pd.concat([pd.read_parquet(f, columns=["prefill_seqs", "decode_seqs", "cycle_s"]) for f in files])
    decode = steps[(steps["prefill_seqs"] == 0) & (steps["decode_seqs"] > 0) & steps["cycle_s"].notna()]
    out = {}
    for label, lo, hi in MEASURED_BATCHES:
        cycles = decode.loc[decode["decode_seqs"].between(lo, hi), "cycle_s"]
        out[label] = (1e3 * float(cycles.median()) if len(cycles) else float("nan"), len(cycles))
    return out


def measured_table(folders: list[Path]) -> str:
    """The markdown table of :func:`measured_cycles`, one row per folder."""
    labels = [label for label, _, _ in MEASURED_BATCHES]
    cells = {folder: measured_cycles(folder) for folder in folders}
    used = [label for label in labels if any(c[label][1] for c in cells.values())]
    lines = ["| probe runs | " + " | ".join(f"{label} seq. (ms)" for label in used) + " |",
             "|---|" + "---|" * len(used)]
    for folder, c in cells.items():
        lines.append(f"| {folder} | " + " | ".join(f"{c[label][0]:.2f} ({c[label][1]})" if c[label][1] else "-"
                                                    for label in used) + " |")
    return "\n".join(lines)


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
    ap.add_argument("logs", nargs="+", type=Path, help="engine logs with vLLM's step lines (with --measured: "
                    "folders of saved probe runs)")
    ap.add_argument("--measured", action="store_true", help="no model: the measured decode-step medians by batch "
                    "size of each folder of probe runs (a markdown table)")
    add_latency_arguments(ap, profile_help="the latency profile (kvtune calibrate; not with --measured)", coef=False)
    add_engine_arguments(ap, model_help="the HF model folder the engine served", gpu_help="device (default: the "
                         "profile's)", set_help="the engine's config (repeatable), as it was started")
    args = ap.parse_args(argv)
    if args.measured:
        try:
            print(measured_table(args.logs))
        except (ConfigError, OSError) as exc:
            print(f"step_check.py: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.profile is None or args.model is None:
        print("step_check.py: --profile and --model are required (unless --measured)", file=sys.stderr)
        return 2
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
