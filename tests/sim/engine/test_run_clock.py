"""The run loop's clock against SimPy's (``sim.run_loop.EngineLoop.process``).

The loop keeps ``env.now`` in a local (``sim_now``), read again after each ``yield``, and its own clock ahead of it
between arrivals.  When it yields to let an arrival in, it waits ``clock - sim_now``: with a stale ``sim_now``
(a re-read dropped) SimPy's clock overshoots the engine's, and arrivals after the engine's clock are added before
the step that starts at it, i.e. scheduled before they arrived.  With a constant step time and room for everyone,
each request is scheduled at the first step that starts at or after its arrival (at the arrival itself when the
engine was idle), which these tests check, over arrivals that fall inside steps and after idle spells.  (Checked:
the first test fails with either re-read that matters dropped, after the yield that lets an arrival in or after an
idle wait; the one after the idle loop's catch-up yield is overwritten at the wake-up before any read.)
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.engine.conftest import make_sim, make_workload

STEP_S = 0.01


def _run(rows, flavor: str):
    sim = make_sim(make_workload(rows), step_s=STEP_S, flavor=flavor, max_num_seqs=64, num_gpu_blocks_override=4096,
                   max_model_len=4096)
    result = sim.run()
    return result.requests.sort_values("request_id"), result.steps


def _step_starts(steps) -> np.ndarray:
    """Every step's start, a run's inner steps included (``num_steps`` steps of ``duration_s / num_steps``: the
    linear model's steps all take ``STEP_S``, so inner starts are within rounding of ``start + j * STEP_S``)."""
    starts = []
    for start, k in zip(steps["start_s"].to_numpy(), steps["num_steps"].to_numpy()):
        starts.extend(start + j * STEP_S for j in range(int(k)))
    return np.array(starts)


def _check_first_opportunity(rows, flavor: str) -> None:
    requests, steps = _run(rows, flavor)
    starts = _step_starts(steps)
    arrival = requests["arrival_s"].to_numpy()
    first = requests["first_scheduled_s"].to_numpy()
    assert (first >= arrival).all(), "a request was scheduled before it arrived (the loop's clock went stale)"
    for a, f in zip(arrival, first):
        # Scheduled at its arrival (an idle engine woke for it) or at the first step boundary after it: no step
        # started in between (a run's inner boundaries too, up to rounding).
        assert f == a or f in steps["start_s"].to_numpy(), (a, f)
        assert not ((starts >= a + 1e-9) & (starts < f - 1e-9)).any(), (a, f)


def test_arrivals_inside_steps_and_after_idle_spells():
    # 0: a long decode; 1, 2 and 3 arrive inside steps (the loop yields to SimPy at the next boundary each time; 3
    # comes just after the boundary that lets 2 in, which a stale clock would overshoot); then an idle spell (4
    # arrives after everything ended) and arrivals inside steps again (5, 6), then idle again (7).
    rows = [(0.0, 10, 40), (0.0155, 10, 30), (0.0655, 10, 5), (0.075, 10, 5), (2.0, 10, 20), (2.0255, 10, 20),
            (2.1055, 10, 3), (5.0, 10, 3)]
    for flavor in ("vllm-v1", "vllm-v0"):
        requests, steps = _run(rows, flavor)
        first = requests["first_scheduled_s"].to_numpy()
        # Known boundaries: the engine steps every 10 ms from each request that found it idle.
        np.testing.assert_allclose(first, [0.0, 0.02, 0.07, 0.08, 2.0, 2.03, 2.11, 5.0], rtol=0, atol=1e-9)
        _check_first_opportunity(rows, flavor)


@settings(max_examples=40, deadline=None)
@given(gaps=st.lists(st.one_of(st.floats(0.0, 0.05), st.floats(0.5, 3.0)), min_size=2, max_size=12),
       outputs=st.lists(st.integers(1, 60), min_size=12, max_size=12), flavor=st.sampled_from(["vllm-v1", "vllm-v0"]))
def test_each_request_scheduled_at_its_first_opportunity(gaps, outputs, flavor):
    t, rows = 0.0, []
    for gap, output in zip(gaps, outputs):
        t += gap
        rows.append((t, 10, output))
    _check_first_opportunity(rows, flavor)
