"""Fleet speed in instructions: ``fleet_speed.py``'s cases counted by valgrind (deterministic, unlike CPU seconds
on a shared 2-core machine, where the same code's share scattered up to 2x between runs).

Each case runs in a fresh ``python`` under ``valgrind --tool=cachegrind --cache-sim=no`` (``PYTHONHASHSEED=0``):
the whole process, imports and set-up included.  A setup process (the single engine on the trace's first 50
requests, with ``sim.fleet`` imported too) is counted once and taken off every case, so that a case's figure is
its run: the single engine's, or the fleet's (its N engines built, routed and run).  The share is the single
engine's run over the fleet's run: the fleet's simulated requests per instruction against the single engine's,
on the same requests (``fleet_speed.py``: a fleet of N runs them at N times the rate).

    python benchmarks/tools/fleet_instructions.py [--replicas 8,64] [--routers all|a,b] [--checkout DIR]

One case under valgrind takes ~1-2 minutes.  Figures: benchmarks/speed/README.md, "Fleet speed"."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from instructions import cachegrind  # benchmarks/tools/ (this script's folder is first on sys.path)

ROOT = Path(__file__).resolve().parents[2]
SETUP_REQUESTS = 50

# The case is ``fleet_speed._case`` itself (rate scale 1 per engine, no shared prefixes, caching off: that
# script's defaults), so both tools measure the same set-up and run.
_CASE = r"""
import sys
checkout, replicas, router, requests = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path[:0] = [checkout, checkout + "/benchmarks"]
import fleet_speed
fleet_speed._case((replicas, router if replicas else None, None if requests == "all" else int(requests), 1.0,
                   False, False))
"""


def count(checkout: Path, replicas: int, router: str, requests: str) -> int:
    """Instructions of one case's whole process."""
    try:
        return cachegrind(["-c", _CASE, str(checkout), str(replicas), router, requests],
                          f"{replicas} x {router} on {checkout}", env={"PYTHONPATH": str(checkout)})
    except RuntimeError as exc:
        raise SystemExit(f"error: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="8,64")
    parser.add_argument("--routers", default="all")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout to count (built in place)")
    opts = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if not (opts.checkout / "sim" / "__init__.py").is_file():
        parser.error(f"--checkout {opts.checkout}: not a kvtune checkout (no sim/__init__.py)")
    sys.path.insert(0, str(opts.checkout))
    from sim import compiled_state
    from sim.fleet import router_names

    routers = router_names() if opts.routers == "all" else opts.routers.split(",")
    unknown = sorted(set(routers) - set(router_names()))
    if unknown:
        parser.error(f"--routers: unknown {', '.join(unknown)} (known: {', '.join(router_names())})")
    print(f"checkout {opts.checkout}, engine {compiled_state()}")
    setup = count(opts.checkout, 0, "-", str(SETUP_REQUESTS))
    single = count(opts.checkout, 0, "-", "all") - setup
    print(f"setup process: {setup / 1e9:.3f} G instructions (taken off each case)")
    print(f"{'case':<30} {'run G instr':>12} {'vs single':>10}")
    print(f"{'single engine':<30} {single / 1e9:12.3f} {1.0:10.2f}", flush=True)
    for n in [int(x) for x in opts.replicas.split(",")]:
        for router in routers:
            run = count(opts.checkout, n, router, "all") - setup
            print(f"{f'{n} x {router}':<30} {run / 1e9:12.3f} {single / run:10.2f}", flush=True)


if __name__ == "__main__":
    main()
