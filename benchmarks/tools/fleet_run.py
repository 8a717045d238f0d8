"""One fleet run of ``benchmarks/fleet_speed.py`` in this process, timed alone: the fleet built as that benchmark
builds it (its trace at N times the rate, no step table, no ended request's state kept), then only
``FleetSimulation.run`` timed (CPU seconds).  ``--stop`` stops the process (SIGSTOP) after the set-up and prints its
pid, so that a sampling profiler attached then sees the run alone (the compiled engine's functions, which cProfile
cannot see), e.g.:

    python benchmarks/tools/fleet_run.py --router least_kv_usage --replicas 64 --stop &
    perf record -F 700 --call-graph dwarf -p PID -o fleet.data & kill -CONT PID; wait %1; kill -INT %2
    perf report -i fleet.data --children --sort symbol -g none
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--router", default="least_kv_usage")
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--stop", action="store_true", help="SIGSTOP after the set-up (print the pid first)")
    opts = parser.parse_args(argv)

    import sim
    from fleet_speed import _workload
    from sim.engine.config import EngineConfig
    from sim.fleet import FleetSimulation
    from sim.profiles import load_gpu, load_model
    from sim.runner import FrozenHeap

    workload = _workload(None, float(opts.replicas), False)
    with FrozenHeap():
        fleet = FleetSimulation(workload, EngineConfig(enable_prefix_caching=False), load_model("Llama-3-8B"),
                                load_gpu("H100-SXM"), replicas=opts.replicas, router=opts.router,
                                record_steps=False, keep_requests=False)
    if opts.stop:
        print("pid", os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    cpu0 = time.process_time()
    fleet.run()
    print(f"{sim.compiled_state()} {opts.replicas} x {opts.router}: run() {time.process_time() - cpu0:.3f} CPU s")


if __name__ == "__main__":
    main()
