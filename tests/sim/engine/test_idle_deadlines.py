"""An idle engine takes a client deadline that has passed (sim/run_loop.py ``EngineLoop._take_passed_deadlines``).

With async scheduling (vLLM 0.33 v1/engine/core.py step_with_batch_queue) the run loop takes deadlines only right
after a ``schedule()``.  A request that ended before its deadline leaves its entry behind; once the engine had
nothing to schedule, that passed deadline was its next event, and both the single engine's loop and the fleet's
waited for it at the same simulated time for ever (``kvtune tune studies/fleet-prefix-routing.yaml`` hung at its
trial 7: 7 replicas behind sglang_cache_aware).  Each case runs in a child process with a generous limit, so that a
hang fails the test instead of stopping the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

CHILD = r"""
import json, sys
from sim.engine.config import EngineConfig
from sim.fleet import simulate_fleet
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.workload.classes import RequestClass
from tests.sim.engine.conftest import make_sim, make_workload

replicas, async_scheduling = int(sys.argv[1]), sys.argv[2] == "1"
classes = {"c": RequestClass("c", timeout_s=1.0)}
# Request 0 ends long before its 1 s deadline; the next arrivals come after it, and to every replica.
rows = [(0.0, 16, 2, "c")] + [(2.0 + 0.5 * i, 16, 2, "c") for i in range(2 * max(replicas, 1))]
wl = make_workload(rows, classes)
knobs = dict(enable_prefix_caching=False, async_scheduling=async_scheduling)
if replicas == 0:
    table = make_sim(wl, **knobs).run().requests
else:
    table = simulate_fleet(wl, EngineConfig(**knobs), load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                           replicas=replicas, router="round_robin", latency=LinearStepModel(0.01, 0.0)).requests
print(json.dumps({"status": table["status"].tolist(), "end_s": table["end_s"].tolist()}))
"""


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("replicas", [0, 1, 3])  # 0: the single engine (Simulation), else a fleet
def test_a_passed_deadline_does_not_stop_the_clock(replicas: int, async_scheduling: bool) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(replicas), "1" if async_scheduling else "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    n = 1 + 2 * max(replicas, 1)
    assert out["status"] == ["finished"] * n
    # Every request is served at its arrival (2 steps of 0.01 s): none waited for a deadline that had passed.
    arrivals = [0.0] + [2.0 + 0.5 * i for i in range(n - 1)]
    assert out["end_s"] == pytest.approx([a + 0.02 for a in arrivals], abs=1e-9)
