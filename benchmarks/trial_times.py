"""Per-trial time of finished studies, read back from their storage: what each trial cost inside the simulator
and around it (issue 30: "adding the GPU list and dtypes does not slow a trial").

For each SQLite file (one ``kvtune tune ... --storage sqlite:///FILE`` run each), over its complete and pruned
trials that simulated: the median of the trial's simulation CPU seconds (``sim.cpu_s``, measured in the worker),
of its span from start to completion in the storage (ask, simulation, metric reduction, tell), and of that span
less its simulation wall (``sim.wall_s``): the time a trial costs outside the simulator; and the default trial's
(trial 0, the engine's default config on the study's first device: the same config in every study run on that
device) simulation CPU seconds.  Files are listed in modification order.

    python benchmarks/trial_times.py FILE.db [FILE.db ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def trial_times(path: Path) -> dict[str, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{path}")
    trials = [t for t in study.get_trials(deepcopy=False)
              if "sim.wall_s" in t.user_attrs and t.datetime_complete is not None]
    span = [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials]
    default = [t for t in trials if t.number == 0]
    return {
        "trials": len(trials),
        "sim_cpu_ms": 1000 * statistics.median(t.user_attrs["sim.cpu_s"] for t in trials),
        "span_ms": 1000 * statistics.median(span),
        "outside_ms": 1000 * statistics.median(s - t.user_attrs["sim.wall_s"] for s, t in zip(span, trials)),
        "default_sim_cpu_ms": 1000 * default[0].user_attrs["sim.cpu_s"] if default else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    print("| storage | trials | sim CPU ms/trial | start-to-complete ms/trial | outside the simulator ms/trial "
          "| default trial's sim CPU ms |")
    print("|---|---|---|---|---|---|")
    for path in sorted(args.files, key=lambda p: p.stat().st_mtime):
        r = trial_times(path)
        print(f"| {path} | {r['trials']} | {r['sim_cpu_ms']:.0f} | {r['span_ms']:.0f} | {r['outside_ms']:.1f} "
              f"| {r['default_sim_cpu_ms']:.0f} |")


if __name__ == "__main__":
    main()
