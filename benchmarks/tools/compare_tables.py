"""Check that a change to the engine leaves every decision alone: run ``benchmarks/sim_speed.py``'s cases with
two checkouts of kvtune and compare their request and step tables.

Each (checkout, case) runs in its own process with that checkout first on ``sys.path``; both build the cases as the
checkout under test (``--new``) defines them, so a case added with the change runs on the base too.  Integer and text
columns must be equal; float columns equal up to ``--rtol`` (relative, default 1e-9: sums of per-step
shares may be added in another order) with NaN equal to NaN.

    python benchmarks/tools/compare_tables.py --base /path/to/other/checkout [--cases 1x,incident,...] [--merge-runs]
    python benchmarks/tools/compare_tables.py --base /path/to/other/checkout --cases fleet

A case ``fleet:ROUTER:N:VARIANT`` is a fleet of N replicas behind ROUTER (``sim.fleet.simulate_fleet``, the request
table with its ``replica`` column, every replica's step table): the first 3,000 requests of ``fleet_speed.py``'s
trace at N times the rate, VARIANT ``plain`` (no shared prefixes), ``prefix`` (its ``--prefix`` hash_ids, prefix
caching on) or ``pressure`` (those, 900 KV blocks a replica, a client timeout of 4 s and 10% of requests cancelled
after 1-30 s, seed 3).  ``--cases fleet`` is every registered router at 1, 3, 8 and 64 replicas in each variant.

``--merge-runs`` compares the step tables in :func:`merge_runs`'s form, for a change that cuts the same decode steps
into runs differently (more steps per row); the request tables must still be equal.

Prints one line per case and exits 1 when any table differs.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
DEFAULT_CASES = "1x,4x,incident,offload,overload-4x,reasoning,prefix,v0-swap"

_DUMP = r"""
import pickle, sys
root, case, path, cases_root = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, cases_root + "/benchmarks")
import sim_speed  # the cases of the checkout under test (it puts that checkout first on sys.path)
import fleet_speed  # (its fleet cases; it imports no sim before the line below)
sys.path.insert(0, root)  # then the engine of the checkout being run (sim is imported by _build, not before)
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
if case.startswith("fleet:"):
    workload, config, model, gpu, kwargs = fleet_speed.compare_case(case)
else:
    workload, config, model, gpu, kwargs = sim_speed._build(case)
kwargs.pop("trial", None)
import sim
assert sim.__file__.startswith(str(__import__("pathlib").Path(root).resolve())), f"ran {sim.__file__}, not {root}"
if case.startswith("fleet:"):
    from sim.fleet import simulate_fleet
    result = simulate_fleet(workload, config, load_model(model), load_gpu(gpu), **kwargs)
else:
    result = simulate(workload, config, load_model(model), load_gpu(gpu), **kwargs)
with open(path, "wb") as f:
    pickle.dump((result.requests, result.steps, result.num_iterations, result.aborted, result.makespan_s), f)
"""


def _dump(root: Path, case: str, out: Path, cases_root: Path) -> tuple:
    subprocess.run([sys.executable, "-c", _DUMP, str(root.resolve()), case, str(out), str(cases_root)], check=True)
    with open(out, "rb") as f:
        return pickle.load(f)


def _diff(name: str, a, b, rtol: float, atol: float = 0.0) -> list[str]:
    import numpy as np

    problems = []
    if list(a.columns) != list(b.columns):
        return [f"{name}: columns differ: {sorted(set(a.columns) ^ set(b.columns))}"]
    if len(a) != len(b):
        return [f"{name}: {len(a)} rows vs {len(b)}"]
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            x, y = x.astype(float), y.astype(float)
            close = np.abs(x - y) <= atol + rtol * np.maximum(np.abs(x), np.abs(y))
            same = (x == y) | (np.isnan(x) & np.isnan(y)) | close
        else:
            same = x == y
        if not same.all():
            i = int(np.argmin(same))
            problems.append(f"{name}.{col}: {int((~same).sum())} rows differ, first row {i}: {x[i]!r} vs {y[i]!r}")
    return problems


def merge_runs(steps):
    """The step table with each stretch of decode-only rows that continue one another (no prefill, preemption
    or swap; the same running, waiting and swapped counts; each row starting where the one before ended) merged
    into one row: the form in which two engines that cut the same decode steps into runs differently agree.
    Counts and times add up, the blocks in use are the last row's."""
    import numpy as np

    decode = ((steps["prefill_tokens_new"] == 0) & (steps["prefill_tokens_recompute"] == 0) & (steps["preempted"] == 0)
              & (steps["swap_out_blocks"] == 0) & (steps["swap_in_blocks"] == 0)).to_numpy()
    same = np.ones(len(steps), dtype=bool)
    for col in ("num_running", "num_waiting", "num_swapped", "kv_blocks_total"):
        x = steps[col].to_numpy()
        same[1:] &= x[1:] == x[:-1]
    end = (steps["start_s"] + steps["duration_s"]).to_numpy()
    start = steps["start_s"].to_numpy()
    joins = np.zeros(len(steps), dtype=bool)
    joins[1:] = decode[1:] & decode[:-1] & same[1:] & np.isclose(start[1:], end[:-1], rtol=1e-12, atol=1e-12)
    group = np.cumsum(~joins)
    summed = [c for c in steps.columns if c in ("num_steps", "duration_s", "decode_tokens") or c.startswith("time_")]
    agg = {c: ("sum" if c in summed else "last" if c == "kv_blocks_used" else "first") for c in steps.columns}
    return steps.groupby(group, sort=False).agg(agg).reset_index(drop=True)


def _fleet_cases() -> list[str]:
    """Every registered router at 1, 3, 8 and 64 replicas in each variant (see the module's docstring)."""
    sys.path.insert(0, str(HERE))
    from sim.fleet import router_names

    return [f"fleet:{router}:{n}:{variant}" for variant in ("plain", "prefix", "pressure") for router in router_names()
            for n in (1, 3, 8, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (e.g. a `git archive` of main)")
    ap.add_argument("--new", default=HERE, type=Path, help="the checkout under test (default: this one)")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--atol", type=float, default=0.0,
                    help="absolute tolerance of float columns besides --rtol (e.g. 1e-9 s: a run's closed-form sums "
                         "and the same steps added one by one round differently)")
    ap.add_argument("--merge-runs", action="store_true",
                    help="compare the step tables after merge_runs (for a change that cuts decode runs differently)")
    args = ap.parse_args()
    for root in (args.base, args.new):
        # (Without sim/ there, the run would import another engine, the installed one, and compare it with itself.)
        if not (root / "sim" / "__init__.py").is_file():
            print(f"error: {root}: not a kvtune checkout (no sim/__init__.py)", file=sys.stderr)
            return 2
    failed = False
    cases = [c for name in args.cases.split(",") for c in (_fleet_cases() if name == "fleet" else [name])]
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            base = _dump(args.base, case, Path(tmp) / f"base-{case}.pkl", args.new)
            new = _dump(args.new, case, Path(tmp) / f"new-{case}.pkl", args.new)
            steps_a, steps_b = (merge_runs(base[1]), merge_runs(new[1])) if args.merge_runs else (base[1], new[1])
            problems = (_diff("requests", base[0], new[0], args.rtol, args.atol)
                        + _diff("steps", steps_a, steps_b, args.rtol, args.atol))
            if base[2:] != new[2:]:
                problems.append(f"iterations/aborted/makespan: {base[2:]} vs {new[2:]}")
            failed |= bool(problems)
            rows = f"{len(base[1])} -> {len(new[1])} step rows ({len(steps_b)} merged)" if args.merge_runs \
                else f"{len(new[1])} step rows"
            print(f"{case}: {'identical' if not problems else 'DIFFERENT'} ({len(new[0])} requests, "
                  f"{rows}, {new[2]} iterations)", flush=True)
            for line in problems[:20]:
                print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
