"""What a simulation's step rows are: the work the engine does per row, which is what sets its speed.

The engine's cost is close to flat per step row (a row is one engine step, or a batched run of identical decode
steps), so the rows a case needs, and which kind they are, say how far batching can still take it.  For each
``benchmarks/sim_speed.py`` case (optionally with engine knobs changed, ``--set max_num_seqs=38``) this prints
the iterations and rows, the decode runs (rows of several steps; their median length), and the single-step rows
by kind: preempting, recompute prefill, new prefill, and plain decode (none of those).  ``mixed repeats`` counts
the single rows with prefill that repeat the row before them (same prefill and decode tokens, same batch, neither
preempting): what batching identical mixed steps could fold into the row before at most.

    python benchmarks/tools/step_rows.py [--cases reasoning,incident,...] [--set knob=value ...] [--model M] [--gpu G]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def classify(steps) -> dict[str, float]:
    """The row counts of one step table (``SimResult.steps``)."""
    import numpy as np

    num_steps = steps["num_steps"].to_numpy()
    single = num_steps == 1
    prefill_new = steps["prefill_tokens_new"].to_numpy()
    recompute = steps["prefill_tokens_recompute"].to_numpy()
    prefill = prefill_new + recompute
    preempted = steps["preempted"].to_numpy() > 0
    decode = steps["decode_tokens"].to_numpy()
    running = steps["num_running"].to_numpy()
    repeats = (single[1:] & single[:-1] & (prefill[1:] > 0) & (prefill[1:] == prefill[:-1])
               & (decode[1:] == decode[:-1]) & (running[1:] == running[:-1]) & ~preempted[1:] & ~preempted[:-1])
    runs = num_steps[~single]
    return {
        "iterations": int(num_steps.sum()),
        "rows": len(steps),
        "runs": int((~single).sum()),
        "median run": float(np.median(runs)) if len(runs) else 0.0,
        "single": int(single.sum()),
        "preempting": int((single & preempted).sum()),
        "recompute prefill": int((single & ~preempted & (recompute > 0)).sum()),
        "new prefill": int((single & ~preempted & (recompute == 0) & (prefill_new > 0)).sum()),
        "plain decode": int((single & ~preempted & (prefill == 0)).sum()),
        "mixed repeats": int(repeats.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="1x,4x,incident,offload,overload-4x,reasoning,prefix,v0-swap")

    from optimizer import add_engine_arguments, parse_pairs

    add_engine_arguments(parser, model_help="run every case on this model (default: each case's)",
                         gpu_help="run every case on this GPU (default: each case's)",
                         set_help="change an engine knob of every case (EngineConfig field; repeatable)")
    args = parser.parse_args()

    import sim_speed
    from sim.engine.config import EngineConfig
    from sim.errors import KvtuneError
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate

    columns = None
    for case in args.cases.split(","):
        workload, config, model, gpu, kwargs = sim_speed._build(case)
        kwargs.pop("trial", None)
        try:  # the case's knobs with --set's on top, read and checked as `kvtune simulate --set` reads them
            if args.set:
                config = EngineConfig.from_dict({**config.explicit_knobs(), **parse_pairs(args.set, "--set")}, "--set")
            profiles = load_model(args.model or model, field="--model"), load_gpu(args.gpu or gpu, field="--gpu")
        except KvtuneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        result = simulate(workload, config, *profiles, **kwargs)
        row = classify(result.steps)
        if columns is None:
            columns = list(row)
            print("| case | " + " | ".join(columns) + " |")
            print("|---" * (len(columns) + 1) + "|")
        print(f"| {case} | " + " | ".join(f"{row[c]:g}" for c in columns) + " |", flush=True)


if __name__ == "__main__":
    main()
