"""Study speed: where a tuning study's wall time goes, trial by trial and outside the trials.

Runs ``kvtune tune SPEC --trials N --no-export`` as the CLI does (``load_study_spec`` + ``Tuner.run``, a fresh SQLite
storage in a temporary folder) in a fresh process per mode, so that start-up (imports, Ray) is counted:

- ``in-process``: trials one by one in the driver (``--executor in-process``);
- ``process-1``, ``process-2``: 1 or 2 worker processes forked from the driver (``--executor process --workers``;
  what ``executor: auto`` picks for this study);
- ``ray-1``, ``ray-2``: a local Ray started by the study, 1 or 2 warm workers (``--executor ray --workers``);
- ``driver-only``: in-process, every trial returning the metrics of one real trial (simulated once, before the
  clock starts; the process wall includes it): the driver's own cost per trial (sampler, storage), nothing simulated.

Figures per mode (median over ``--repeats``): the process's wall seconds from its start to its exit (what the user
waits for), the study's own wall (``Tuner.run``), the start-up before the first trial (imports, building the
workload, opening the storage, starting Ray and warming its workers), the driver's CPU seconds, trials per second
of the trial loop, each trial's simulation CPU and wall seconds (``sim.cpu_s``/``sim.wall_s``, measured in the
worker), the driver's time per trial asking (sampler + storage) and telling (storage), and the worker time per
trial that went to anything but simulating (the loop's wall x workers, less the trials' simulation wall, per trial),
and the user attributes a complete trial stores (rows of Optuna's ``trial_user_attributes``, median).  A second
table gives the split ``kvtune tune`` prints (``StudyResult.split``: start, trials, storage, shutdown; they sum
to the study's wall) with the imports before it.

    python benchmarks/study_speed.py [--modes in-process,process-2,ray-2] [--trials 40] [--repeats 1] [--spec PATH]

On the 2-core machine run it pinned and niced when the other core is busy (``taskset -c 1 nice -n 5``): the
``ray-2`` figures then only say what two workers on one core do.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed one
MODES = ("in-process", "process-1", "process-2", "ray-1", "ray-2", "driver-only")


class _StoredMetrics:
    """A trial backend that returns the same metrics for every config (``driver-only``)."""

    name = "stored"

    def __init__(self, metrics: dict) -> None:
        self.metrics = metrics

    def prepare(self, seeds) -> None:
        pass

    def run(self, params, seeds) -> dict:
        return {**self.metrics, "sim.cpu_s": 0.0, "sim.wall_s": 0.0}


def _child(mode: str, spec_path: str, trials: int, started: float, queue) -> None:
    t_import = time.perf_counter()
    import io

    from optimizer import InProcessExecutor, ProcessExecutor, Tuner, load_study_spec

    imports_s = time.perf_counter() - t_import
    spec = load_study_spec(spec_path)
    backend = None
    if mode == "driver-only":
        from optimizer import SimBackend, prepare

        ctx = prepare(spec)
        sim = SimBackend.for_spec(spec, ctx.workloads)
        backend = _StoredMetrics(sim.run({}, ctx.seeds))
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        local = mode in ("in-process", "driver-only")
        workers = None if local else int(mode.split("-")[1])
        executor = (InProcessExecutor() if local else
                    ProcessExecutor(workers=workers) if mode.startswith("process") else None)
        tuner = Tuner(spec, trials=trials, workers=workers, out=out, progress=io.StringIO(), backend=backend,
                      executor=executor, executor_kind="ray")
        result = tuner.run()
        trials_run = [t for t in tuner.study.get_trials(deepcopy=False) if "sim.cpu_s" in t.user_attrs]
        sim_cpu = [float(t.user_attrs["sim.cpu_s"]) for t in trials_run]
        sim_wall = [float(t.user_attrs["sim.wall_s"]) for t in trials_run]
        trial_wall = [float(t.user_attrs["wall_s"]) for t in trials_run]
        # One row of Optuna's trial_user_attributes table per key.
        attr_rows = [len(t.user_attrs) for t in trials_run if t.state.name == "COMPLETE"]
    queue.put({
        "mode": mode, "workers": workers or 1, "imports_s": imports_s, "study_s": result.wall_s,
        "driver_cpu_s": time.process_time() - cpu0, "phases": result.phases, "ran": result.ran,
        "complete": result.complete, "failed": result.failed, "sim_cpu": sim_cpu, "sim_wall": sim_wall,
        "trial_wall": trial_wall, "attr_rows": attr_rows, "started": started, "split": result.split,
    })


def _run(ctx, mode: str, spec: str, trials: int) -> dict:
    queue = ctx.Queue()
    t0 = time.perf_counter()
    proc = ctx.Process(target=_child, args=(mode, spec, trials, time.time(), queue))
    proc.start()
    row = queue.get()
    proc.join()
    row["process_s"] = time.perf_counter() - t0
    return row


def _figures(row: dict) -> dict:
    ph = row["phases"]
    ran = max(row["ran"], 1)
    loop = row["study_s"] - sum(ph.get(k, 0.0) for k in ("prepare", "storage", "executor_start", "shutdown"))
    startup = row["imports_s"] + sum(ph.get(k, 0.0) for k in ("prepare", "storage", "executor_start"))
    sim_wall = sum(row["sim_wall"])
    return {
        "process_s": row["process_s"], "study_s": row["study_s"], "startup_s": startup,
        "executor_start_s": ph.get("executor_start", 0.0), "shutdown_s": ph.get("shutdown", 0.0),
        "driver_cpu_s": row["driver_cpu_s"], "loop_s": loop, "trials_per_s": row["ran"] / loop if loop > 0 else 0.0,
        "sim_cpu": statistics.median(row["sim_cpu"]) if row["sim_cpu"] else float("nan"),
        "sim_wall": statistics.median(row["sim_wall"]) if row["sim_wall"] else float("nan"),
        "sim_cpu_total": sum(row["sim_cpu"]),
        "ask_ms": 1000 * ph.get("ask", 0.0) / ran, "tell_ms": 1000 * ph.get("tell", 0.0) / ran,
        "idle_s": (loop * row["workers"] - sim_wall) / ran,
        "attr_rows": statistics.median(row["attr_rows"]) if row["attr_rows"] else float("nan"),
        "imports_s": row["imports_s"], **{f"split_{k}": v for k, v in row["split"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode (median reported)")
    ap.add_argument("--spec", default=str(ROOT / "studies" / "kv-pressure-incident.yaml"))
    args = ap.parse_args()
    # Ray's workers import kvtune from this checkout too (they inherit the environment).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ctx = mp.get_context("spawn")
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"# {Path(args.spec).name}, {args.trials} trials; {os.cpu_count()} CPUs (this process on {affinity}), "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print("| mode | process wall s | study wall s | start-up s (Ray start) | driver CPU s | trials/s (loop) | "
          "sim CPU s/trial | sim wall s/trial | sim CPU s total | ask ms/trial | tell ms/trial | "
          "worker s/trial not simulating | shutdown s | user attrs/trial |")
    print("|" + "---|" * 14)
    rates = {}
    splits = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        runs = [_figures(_run(ctx, mode, args.spec, args.trials)) for _ in range(max(1, args.repeats))]
        f = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rates[mode] = f["trials_per_s"]
        print(f"| {mode} | {f['process_s']:.1f} | {f['study_s']:.1f} | {f['startup_s']:.1f} "
              f"({f['executor_start_s']:.1f}) | {f['driver_cpu_s']:.1f} | {f['trials_per_s']:.3f} | "
              f"{f['sim_cpu']:.2f} | {f['sim_wall']:.2f} | {f['sim_cpu_total']:.1f} | {f['ask_ms']:.0f} | "
              f"{f['tell_ms']:.0f} | {f['idle_s']:.2f} | {f['shutdown_s']:.1f} | {f['attr_rows']:.0f} |", flush=True)
        splits.append((mode, f))
    print("\n| mode | imports s | study wall s | start s | trials s | storage s | shutdown s |")
    print("|" + "---|" * 7)
    for mode, f in splits:
        print(f"| {mode} | {f['imports_s']:.1f} | {f['study_s']:.1f} | {f['split_start']:.1f} | {f['split_trials']:.1f} "
              f"| {f['split_storage']:.1f} | {f['split_shutdown']:.1f} |")
    if "ray-1" in rates and "ray-2" in rates and rates["ray-1"] > 0:
        print(f"# trials/s, 2 Ray workers over 1: {rates['ray-2'] / rates['ray-1']:.2f}x")


if __name__ == "__main__":
    main()
