"""``kvtune simulate`` keeps its memory to the table rows (issue 34: request state dropped at its end, the step
table kept as columns chunk by chunk and dropped before the request metrics) and writes what a run keeping
everything gives: the same request and step tables and the same metrics, exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import sim.engine.core as core_module
import sim.request_store as runner_module
from objectives import StepTotals, step_stats, summarize
from optimizer.cli import main
from sim.engine import EngineConfig
from sim.engine.core import STEP_COLUMNS
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.tables import StepColumns, step_table
from sim.workload import bundled_trace_path, load_trace


def _rows(n: int) -> list[tuple]:
    rng = np.random.default_rng(0)
    ints = rng.integers(0, 10**6, (n, len(STEP_COLUMNS)))
    floats = rng.random((n, len(STEP_COLUMNS)))
    floats_at = {j for j, c in enumerate(STEP_COLUMNS) if c in ("start_s", "duration_s") or c.startswith("time_")}
    return [tuple(float(floats[i, j]) if j in floats_at else int(ints[i, j]) for j in range(len(STEP_COLUMNS)))
            for i in range(n)]


def test_step_columns_equal_the_step_table_of_all_rows():
    rows = _rows(1000)
    columns = StepColumns()
    start = 0
    for size in (1, 3, 0, 500, 7, 489):  # grown several times, an empty chunk among them
        columns.add(step_table(rows[start:start + size]))
        start += size
    pd.testing.assert_frame_equal(columns.table(), step_table(rows), check_exact=True)
    pd.testing.assert_frame_equal(StepColumns().table(), step_table([]), check_exact=True)


def test_step_totals_of_a_table_are_its_step_stats():
    rows = _rows(300)
    table = step_table(rows)
    assert StepTotals.of(table).stats() == step_stats(table)
    assert StepTotals.of(step_table([])).rows == 0


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_cli_simulate_writes_what_a_kept_run_gives(tmp_path, monkeypatch):
    monkeypatch.setattr(core_module, "ROWS_CHUNK", 50)  # the step rows in several chunks
    monkeypatch.setattr(runner_module, "LIST_CHUNK", 64)  # requests made at arrival, a few at a time
    out = tmp_path / "out"
    # The incident's engine (L40S) at 4x the rate: preemptions, a full KV cache.
    assert main(["simulate", "--gpu", "L40S", "--max-requests", "600", "--rate-scale", "4",
                 "--out", str(out)]) == 0
    workload = load_trace(bundled_trace_path()).head(600).scale_rate(4.0)
    kept = simulate(workload, EngineConfig(), load_model("Llama-3-8B"), load_gpu("L40S"))
    assert len(kept.steps) > 50 and kept.requests["num_preemptions"].sum() > 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "requests.parquet"), kept.requests, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "steps.parquet"), kept.steps, check_exact=True)
    expected = json.loads(json.dumps(summarize(kept.requests, kept.steps, workload.classes).to_dict(), default=str))
    written = json.loads((out / "summary.json").read_text())["metrics"]
    assert written.keys() == expected.keys()
    assert [k for k in expected if not _same(written[k], expected[k])] == []


@pytest.mark.parametrize("n", [0, 1])
def test_step_columns_of_tiny_runs(n):
    rows = _rows(n)
    columns = StepColumns()
    columns.add(step_table(rows))
    pd.testing.assert_frame_equal(columns.table(), step_table(rows), check_exact=True)
