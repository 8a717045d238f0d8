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
        (1, 0, 64, 1, 2, 1),     # preempting (a chunk went on in it)
        (1, 0, 64, 1, 2, 0),     # recompute prefill, the row before's shape but not a repeat: that one preempted
    ])
    got = classify(steps)
    assert got == {"iterations": 15, "rows": 9, "runs": 2, "median run": 4.0, "single": 7, "preempting": 2,
                   "recompute prefill": 2, "new prefill": 2, "plain decode": 1, "mixed repeats": 1}


def _classify_by_row(steps) -> dict[str, float]:
    """The classes read row by row, as the tool's docstring states them (the reference for its array version)."""
    import statistics

    got = dict.fromkeys(("preempting", "recompute prefill", "new prefill", "plain decode", "mixed repeats"), 0)
    runs, before = [], None
    for row in steps.itertuples():
        prefill = row.prefill_tokens_new + row.prefill_tokens_recompute
        if row.num_steps > 1:
            runs.append(row.num_steps)
        elif row.preempted:
            got["preempting"] += 1
        elif row.prefill_tokens_recompute:
            got["recompute prefill"] += 1
        elif row.prefill_tokens_new:
            got["new prefill"] += 1
        else:
            got["plain decode"] += 1
        if (before is not None and row.num_steps == 1 == before.num_steps and prefill and not row.preempted
                and not before.preempted and prefill == before.prefill_tokens_new + before.prefill_tokens_recompute
                and row.decode_tokens == before.decode_tokens and row.num_running == before.num_running):
            got["mixed repeats"] += 1
        before = row
    single = len(steps) - len(runs)
    return {"iterations": int(steps["num_steps"].sum()), "rows": len(steps), "runs": len(runs),
            "median run": float(statistics.median(runs)) if runs else 0.0, "single": single, **got}


def test_classes_of_a_simulated_table():
    """On simulations that preempt and re-prefill (a small KV cache) and chunk prompts over several steps (a small
    token budget), the tool's classes are those read row by row, and its steps add up to the engine's iterations."""
    rows = [(i * 0.005, 40 + 13 * i % 120, 20 + 7 * i % 60) for i in range(80)]
    for blocks, budget in ((40, 32), (60, 48)):
        config = EngineConfig(num_gpu_blocks_override=blocks, max_model_len=256, max_num_batched_tokens=budget,
                              max_num_seqs=8)
        result = Simulation(make_workload(rows), config, load_model("Llama-3-8B"), load_gpu("H100-SXM"), seed=3).run()
        got = _classify()(result.steps)
        assert got == _classify_by_row(result.steps)
        assert got["iterations"] == result.num_iterations
        assert min(got["preempting"], got["recompute prefill"], got["mixed repeats"], got["runs"]) > 0
