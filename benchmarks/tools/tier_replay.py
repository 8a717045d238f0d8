"""The CPU offload tier alone, load-proof: record the calls that the ``offload`` case (benchmarks/sim_speed.py) makes to
``CpuBlockTier`` in one run, then replay them on the compiled tier of one or more checkouts, each in a fresh process,
alternated, CPU seconds of the replay (min of 5 after one warm-up replay per process).

    python benchmarks/tools/tier_replay.py record CALLS.pkl
    python benchmarks/tools/tier_replay.py replay CALLS.pkl CHECKOUT [CHECKOUT ...] [--rounds N]

``record`` runs the interpreted engine (``KVTUNE_PURE_PYTHON=1``, set here: a compiled class's methods cannot be
wrapped) and logs each step store (``store_step`` where the checkout has it, else ``store``: the scheduler's), each
``restore`` the scheduler calls itself, ``offload``, ``take_copied`` and ``cached_prefix``.  ``replay`` stores each step
the way that checkout's scheduler does (``store_step`` if it has one) and checks that every checkout returns the same
copies.  benchmarks/speed/README.md, the per-case section, reports its figures.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def record(path: Path) -> None:
    os.environ["KVTUNE_PURE_PYTHON"] = "1"
    sys.path.insert(0, str(ROOT))
    import sim.engine.kv_cache as kv
    from benchmarks.sim_speed import _build
    from sim.profiles import load_gpu, load_model
    from sim.runner import simulate
    from sim.tables import StepColumns

    tier = kv.CpuBlockTier
    log: list[tuple] = []
    step_name = "store_step" if hasattr(tier, "store_step") else "store"
    step, restore = getattr(tier, step_name), tier.restore
    offload, take, lookup = tier.offload, tier.take_copied, tier.cached_prefix
    inside = [0]  # store's own restore calls are not the scheduler's

    def logged_step(self, keys, fulls):
        log.append(("step", list(kv._ints(keys)), list(kv._ints(fulls)), self.capacity))
        inside[0] += 1
        try:
            return step(self, keys, fulls)
        finally:
            inside[0] -= 1

    def logged_restore(self, keys, fulls, m=-1):
        if not inside[0]:
            log.append(("restore", list(keys), list(fulls), m))
        return restore(self, keys, fulls, m)

    def logged_offload(self, key, n):
        log.append(("one", key, n))
        inside[0] += 1
        try:
            return offload(self, key, n)
        finally:
            inside[0] -= 1

    setattr(tier, step_name, logged_step)
    tier.restore = logged_restore
    tier.offload = logged_offload
    tier.take_copied = lambda self, key: (log.append(("take", key)), take(self, key))[1]
    tier.cached_prefix = lambda self, key: (log.append(("lookup", key)), lookup(self, key))[1]
    workload, config, model, gpu, _ = _build("offload")
    simulate(workload, config, load_model(model), load_gpu(gpu), keep_requests=False, record_steps=False,
             step_sink=StepColumns().add)
    with open(path, "wb") as f:
        pickle.dump(log, f)
    steps = [c for c in log if c[0] == "step"]
    cap = steps[0][3]
    over = sum(sum(min(n, cap) for n in c[2] if n > 0) > cap for c in steps)
    print(f"{len(log)} calls, {len(steps)} step stores of {sum(len(c[1]) for c in steps)} keys, capacity {cap} "
          f"blocks, {over} step stores beyond it")


def replay_one(path: Path) -> None:
    import sim
    from sim.engine.kv_cache import CpuBlockTier

    with open(path, "rb") as f:
        log = pickle.load(f)
    cap = next(c[3] for c in log if c[0] == "step")

    def replay() -> tuple[float, int]:
        tier = CpuBlockTier(cap)
        step = getattr(tier, "store_step", tier.store)
        out = 0
        t = time.process_time()
        for c in log:
            if c[0] == "step":
                out += step(list(c[1]), c[2])
            elif c[0] == "restore":
                out += tier.restore(c[1], c[2], c[3])
            elif c[0] == "one":
                out += tier.offload(c[1], c[2])
            elif c[0] == "take":
                out += tier.take_copied(c[1])
            else:
                out += tier.cached_prefix(c[1])
        return time.process_time() - t, out

    replay()
    runs = [replay() for _ in range(5)]
    print(f"{min(t for t, _ in runs):.4f} {runs[0][1]} {sim.compiled_state()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("record", "replay", "one"))
    ap.add_argument("calls", type=Path)
    ap.add_argument("checkouts", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.mode == "record":
        record(args.calls)
    elif args.mode == "one":
        replay_one(args.calls)
    else:
        results: dict[Path, list[float]] = {c: [] for c in args.checkouts}
        copies = set()
        for _ in range(args.rounds):
            for checkout in args.checkouts:
                out = subprocess.run([sys.executable, __file__, "one", str(args.calls.resolve())], check=True,
                                     cwd=checkout, capture_output=True, text=True,
                                     env=dict(os.environ, PYTHONPATH=str(checkout.resolve()))).stdout.split()
                results[checkout].append(float(out[0]))
                copies.add(out[1])
                print(f"  {checkout}: {out[0]} CPU s ({out[2]})", file=sys.stderr)
        if len(copies) != 1:
            raise SystemExit(f"the checkouts' tiers copied different totals: {sorted(copies)}")
        for checkout, times in results.items():
            print(f"{checkout}: replay CPU s min {min(times):.4f}, each {' / '.join(f'{t:.4f}' for t in times)}")


if __name__ == "__main__":
    main()
