"""The decode fast path (``BaseScheduler._schedule_decode_prefix``) against the general loops it mirrors: the same
runs with it off (it returns 0, "nothing changed", and the general loop schedules every request) give the same request
and step tables and the same per-request counters.  With it off a run's entries all come through
``update_from_output``'s second segment (one processed token fewer than the steps: the first was counted at schedule
time), with it on through the first: the counters check both.  Interpreted only (a compiled method cannot be
patched); ``test_compiled_engine.py`` ties the compiled engine to the interpreted one."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from sim import _compiled
from sim.engine.request import Status
from sim.engine.scheduler_base import BaseScheduler
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.test_invariants import configs, workloads

pytestmark = pytest.mark.skipif(_compiled.state() == "compiled", reason="patches an interpreted method")

#: (Not ``appended_tokens``: V0's block table, which V1's general loop leaves alone and the fast path sets.)
COUNTERS = ("num_computed_tokens", "num_output_tokens", "high_water", "processed_tokens", "blocks", "kv_blocks_peak",
            "recomputed_tokens", "num_preemptions", "time_decode_s", "time_overhead_s")


def _run(workload, config, batch_runs):
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs, decode_columns=False)
    result = sim.run()
    # (Finished requests: an aborted one's ``processed_tokens`` may differ, the fast path's entries being counted at
    # update time and the general loop's at schedule time; no table shows it.)
    counters = [tuple(getattr(r, name) for name in COUNTERS) for r in sim.requests if r.status == Status.FINISHED]
    return result, counters


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_fast_path_off_same_tables(workload, config_and_runs):
    config, batch_runs = config_and_runs
    on, on_counters = _run(workload, config, batch_runs)
    original = BaseScheduler._schedule_decode_prefix
    BaseScheduler._schedule_decode_prefix = lambda self, *args, **kwargs: 0
    try:
        off, off_counters = _run(workload, config, batch_runs)
    finally:
        BaseScheduler._schedule_decode_prefix = original
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)
    assert on_counters == off_counters
