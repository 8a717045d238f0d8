"""``benchmarks/real_engine/step_check.py --measured``: the decode-only steps' median cycle by batch size per folder
of saved probe runs, on synthetic ``engine_steps.parquet`` files whose medians are known.  No engine needed."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from real_engine_helpers import load_benchmark


@pytest.fixture(scope="module")
def step_check():
    return load_benchmark("step_check.py", "real_engine_step_check")


def _run(folder, rows):
    folder.mkdir(parents=True)
    pd.DataFrame(rows, columns=["prefill_seqs", "decode_seqs", "cycle_s"]).to_parquet(folder / "engine_steps.parquet")


def test_medians_by_batch_size_over_the_runs_of_a_folder(step_check, tmp_path):
    probes = tmp_path / "probes"
    # Two runs: one-sequence decodes 10, 12 and 30 ms (median 12), a prefill step and a step without a cycle left
    # out; 3-sequence decodes 20 and 22 ms (median 21); nothing at 5 or more.
    _run(probes / "00-decode", [(0, 1, 0.010), (0, 1, 0.012), (1, 1, 0.500), (0, 1, math.nan), (0, 3, 0.020)])
    _run(probes / "01-decode", [(0, 1, 0.030), (0, 3, 0.022), (1, 0, 0.400)])
    cells = step_check.measured_cycles(probes)
    assert cells["1"] == (pytest.approx(12.0), 3)
    assert cells["2-4"] == (pytest.approx(21.0), 2)
    assert math.isnan(cells["5-8"][0]) and cells["5-8"][1] == 0
    table = step_check.measured_table([probes]).splitlines()
    assert table[0] == "| probe runs | 1 seq. (ms) | 2-4 seq. (ms) |"
    assert table[2] == f"| {probes} | 12.00 (3) | 21.00 (2) |"


def test_a_folder_without_probe_runs_is_one_line_and_exit_2(step_check, tmp_path, capsys):
    assert step_check.main(["--measured", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "engine_steps.parquet" in err[0]


def test_without_measured_the_profile_is_required(step_check, tmp_path, capsys):
    assert step_check.main([str(tmp_path / "engine.log")]) == 2
    assert "--profile" in capsys.readouterr().err
