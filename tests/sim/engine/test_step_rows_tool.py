"""benchmarks/tools/step_rows.py: the row classes it reports for a step table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload

TOOL = Path(__file__).resolve().parents[3] / "benchmarks" / "tools" / "step_rows.py"


def _classify():
    spec = importlib.util.spec_from_file_location("step_rows_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.classify


def _table(rows):
    cols = ("num_steps", "prefill_tokens_new", "prefill_tokens_recompute", "decode_tokens", "num_running", "preempted")
    return pd.DataFrame(rows, columns=cols)


def test_each_row_lands_in_one_class():
    classify = _classify()
    steps = _table([
        (1, 300, 0, 0, 1, 0),    # new prefill
        (1, 300, 0, 0, 1, 0),    # new prefill, a repeat of the row before
        (5, 0, 0, 10, 2, 0),     # a run of 5 steps
        (1, 0, 0, 2, 2, 1),      # preempting
        (1, 0, 120, 1, 2, 0),    # recompute prefill
        (1, 0, 0, 2, 2, 0),      # plain decode
        (3, 0, 0, 6, 2, 0),      # a run of 3 steps
    ])
    got = classify(steps)
    assert got == {"iterations": 13, "rows": 7, "runs": 2, "median run": 4.0, "single": 5, "preempting": 1,
                   "recompute prefill": 1, "new prefill": 2, "plain decode": 1, "mixed repeats": 1}


def test_classes_cover_a_simulated_table():
    """On a simulation that preempts, the single-step classes add up to the single rows and the rows' steps to the
    engine's iterations."""
    rows = [(i * 0.005, 40 + 13 * i % 120, 20 + 7 * i % 60) for i in range(80)]
    result = Simulation(make_workload(rows), EngineConfig(num_gpu_blocks_override=40, max_model_len=256),
                        load_model("Llama-3-8B"), load_gpu("H100-SXM"), seed=3).run()
    got = _classify()(result.steps)
    assert got["iterations"] == result.num_iterations
    assert got["rows"] == len(result.steps) == got["runs"] + got["single"]
    assert got["preempting"] > 0
    assert got["preempting"] + got["recompute prefill"] + got["new prefill"] + got["plain decode"] == got["single"]
