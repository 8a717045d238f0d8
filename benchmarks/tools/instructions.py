"""Instructions a ``sim_speed`` case's ``simulate`` executes, counted by valgrind (cachegrind): a measure of a
change's cost that does not drift with the machine's speed, as CPU seconds here do (by 10-50% between runs).

Each (checkout, case) runs twice under ``valgrind --tool=cachegrind --cache-sim=no`` in a fresh process with
``PYTHONHASHSEED=0``, building the case, loading the compiled kernels and simulating it twice, then four times;
half the difference is one simulation's count.  The start-up cancels, and so does the first simulation, in which
numba compiles the kernels again (its on-disk cache is for the real CPU, not valgrind's), billions of
instructions that would swamp a change's.  Both checkouts build the case as this checkout's ``benchmarks/sim_speed.py`` defines it.
Valgrind runs Python 20-60x slower: a case of ~1 CPU s takes several minutes.  The four runs of a comparison go
two at a time.

    python benchmarks/tools/instructions.py --cases incident[,reasoning...] [--base OTHER_CHECKOUT]

Prints one line per case and checkout: giga-instructions of ``simulate``, and the ratio to the base.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]

_RUN = r"""
import sys
case, root, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4] + "/benchmarks")
import sim_speed  # the cases as the checkout under test defines them (it puts that checkout first on sys.path)
sys.path.insert(0, root)
for name in [m for m in sys.modules if m == "sim" or m.startswith("sim.")]:
    del sys.modules[name]
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
import sim
assert sim.__file__.startswith(root), sim.__file__
workload, config, model, gpu, kwargs = sim_speed._build(case)
kwargs.pop("trial", None)
model, gpu = load_model(model), load_gpu(gpu)
from sim.engine.decode_columns import warm_up
warm_up()
for _ in range(repeat):
    simulate(workload, config, model, gpu, **kwargs)
"""


def cachegrind(argv: list[str], what: str, env: dict[str, str] | None = None) -> int:
    """Instructions of a whole ``python ARGV...`` process under ``valgrind --tool=cachegrind --cache-sim=no`` with
    ``PYTHONHASHSEED=0`` (and ``env`` added); a failure raises RuntimeError naming ``what``."""
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                           sys.executable, *argv],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0", **(env or {})))
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not found:
        lines = [line for line in proc.stderr.splitlines() if not line.startswith(("==", "--"))]
        raise RuntimeError(f"the valgrind run of {what} failed (exit {proc.returncode}): "
                           + ("\n".join(lines[-5:]) or proc.stderr[-500:]))
    return int(found.group(1).replace(",", ""))


def _count(case: str, root: Path, repeat: int) -> int:
    return cachegrind(["-c", _RUN, case, str(root.resolve()), str(repeat), str(HERE)], f"{case!r} on {root}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="incident", help="comma-separated sim_speed cases")
    ap.add_argument("--base", type=Path, help="another checkout to compare with")
    ap.add_argument("--new", type=Path, default=HERE, help="the checkout under test (default: this one)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("error: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    roots = [args.new] + ([args.base] if args.base else [])
    for root in roots:
        if not (root / "sim" / "__init__.py").is_file():
            print(f"error: {root}: not a kvtune checkout (no sim/__init__.py)", file=sys.stderr)
            return 2
    with ThreadPoolExecutor(2) as pool:
        for case in args.cases.split(","):
            jobs = {(root, rep): pool.submit(_count, case, root, rep) for root in roots for rep in (2, 4)}
            try:
                counts = {root: (jobs[root, 4].result() - jobs[root, 2].result()) / 2 for root in roots}
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            for root in roots:
                ratio = f", {counts[root] / counts[args.base]:.3f}x the base" if args.base and root != args.base else ""
                print(f"{case}: {root}: {counts[root] / 1e9:.3f} G instructions in simulate{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
