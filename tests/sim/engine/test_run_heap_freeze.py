"""``simulate`` and ``Simulation.run`` freeze the heap they start with (the collector's full passes skip it) and
leave the collector as it found it: unfrozen after a run, also one that failed, and still frozen after a run inside
a heap someone else froze."""

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


def test_simulate_freezes_the_set_up_and_the_run_and_unfreezes_after():
    from sim.engine.config import EngineConfig
    from sim.latency import LinearStepModel
    from sim.profiles import load_gpu, load_model
    from sim.runner import FrozenHeap, simulate

    gc.unfreeze()
    seen = []

    class Spy(LinearStepModel):  # the latency model is asked during the run
        def step_time(self, shape):
            seen.append(gc.get_freeze_count())
            return super().step_time(shape)

    result = simulate(_workload(), EngineConfig(), load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                      latency=Spy(0.01, 0.0))
    assert len(result.requests) == 3 and seen and min(seen) > 0
    assert gc.get_freeze_count() == 0
    with FrozenHeap() as heap:
        assert heap.froze and gc.get_freeze_count() > 0
        with FrozenHeap() as inner:
            assert not inner.froze
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
