"""A run that keeps neither its step table nor its requests' live state reports the same as one that keeps both.

``keep_requests=False`` drops each request once it ended (its row is in the request table's arrays);
``record_steps=False`` with a ``step_sink`` hands the step table on in chunks, from which
``objectives.StepTotals`` accumulates the step metrics a study trial needs.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.engine.core as core_module
import sim.request_store as runner_module
from objectives import StepTotals, step_stats, summarize
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from sim.tables import StepColumns
from tests.sim.engine.test_invariants import configs, workloads


def _run(workload, config, batch_runs, max_sim_time_s=math.inf, **kwargs):
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs,
                     max_sim_time_s=max_sim_time_s, **kwargs)
    return sim, sim.run()


def _same_stats(a, b):
    """Equal up to float rounding: the streamed totals add chunk sums (BusyTime's parts too)."""
    for name, x in vars(a).items():
        y = getattr(b, name)
        if dataclasses.is_dataclass(x):
            _same_stats(x, y)
            continue
        if not isinstance(x, float):
            assert x == y, (name, x, y)
            continue
        assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (name, x, y)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(workload=workloads(with_clients=True), config_and_runs=configs(), stop_early=st.booleans())
def test_streamed_run_reports_what_a_kept_run_does(workload, config_and_runs, stop_early, monkeypatch):
    config, batch_runs = config_and_runs
    monkeypatch.setattr(core_module, "ROWS_CHUNK", 3)  # several chunks even for tiny runs
    # Requests made at arrival from their columns a few at a time (the kept run makes them all up front).
    monkeypatch.setattr(runner_module, "LIST_CHUNK", 3)
    # Stopping at the median arrival leaves some requests running, some waiting, some never arrived.
    stop = float(workload.requests["arrival_s"].median()) + 0.05
    for max_sim_time_s in ((stop,) if stop_early else (math.inf,)):
        _, kept = _run(workload, config, batch_runs, max_sim_time_s)
        totals, columns = StepTotals(), StepColumns()

        def sink(chunk):
            totals.add(chunk)
            columns.add(chunk)

        sim, streamed = _run(workload, config, batch_runs, max_sim_time_s, keep_requests=False,
                             record_steps=False, step_sink=sink)
        pd.testing.assert_frame_equal(kept.requests, streamed.requests)
        # The streamed chunks (the engine's flat float64 rows) are the kept step table, value for value.
        pd.testing.assert_frame_equal(kept.steps, columns.table(), check_exact=True)
        assert sim.requests == [] and len(streamed.steps) == 0
        assert totals.rows == len(kept.steps)
        _same_stats(step_stats(kept.steps), totals.stats())
        _same_stats(step_stats(kept.steps), step_stats(totals))
        a = summarize(kept.requests, kept.steps, workload.classes).to_dict()
        b = summarize(streamed.requests, totals, workload.classes).to_dict()
        assert a.keys() == b.keys()
        for key in a:
            assert (a[key] != a[key] and b[key] != b[key]) or math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-12), key
        if max_sim_time_s == math.inf and kept.aborted is None:
            # Only requests in the system were alive at once.
            assert not sim._live
