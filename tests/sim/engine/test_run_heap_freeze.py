"""``Simulation.run`` freezes the heap it starts with (the collector's full passes skip it) and leaves the
collector as it found it: unfrozen after a run, also one that failed, and still frozen after a run inside a heap
someone else froze."""

from __future__ import annotations

import gc

import pytest

from tests.sim.engine.conftest import make_sim, make_workload


class _Boom(Exception):
    pass


def _workload():
    return make_workload([(0.0, 100, 20), (0.01, 50, 5), (0.02, 300, 40)])


def test_the_run_freezes_its_starting_heap_and_unfreezes_it():
    gc.unfreeze()
    sim = make_sim(_workload())
    seen = []
    sim.core.schedule_hook = lambda out: seen.append(gc.get_freeze_count())
    result = sim.run()
    assert len(result.requests) == 3 and seen
    assert min(seen) > 0  # frozen while it ran
    assert gc.get_freeze_count() == 0


def test_a_failed_run_unfreezes_the_heap():
    gc.unfreeze()
    sim = make_sim(_workload())

    def boom(out):
        raise _Boom

    sim.core.schedule_hook = boom
    with pytest.raises(_Boom):
        sim.run()
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_before_the_run_stays_frozen():
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        make_sim(_workload()).run()
        assert gc.get_freeze_count() > 0  # (the count can drop by objects freed meanwhile, not to 0)
    finally:
        gc.unfreeze()
