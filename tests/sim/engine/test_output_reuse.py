"""One ``SchedulerOutput`` reused from step to step (``BaseScheduler.new_output``/``recycle``, ``EngineCore._hand_back``):
a reset output is a fresh one, field by field; whole runs give the same tables with reuse and without it (a schedule
hook turns it off); and an output given to an observer is never reused.  Compiled and interpreted."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings

from sim.engine.scheduler_output import SchedulerOutput
from sim.latency import LinearStepModel, StepShape
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.test_invariants import configs, workloads


def _fields(obj: object) -> tuple[str, ...]:
    """Every attribute a fresh object sets (a compiled class names them in ``__mypyc_attrs__``)."""
    names = getattr(type(obj), "__mypyc_attrs__", None)
    return tuple(names) if names is not None else tuple(vars(obj))


def _dirty(obj: object) -> None:
    """Every field set away from its fresh value, as a step leaves it."""
    for name in _fields(obj):
        value = getattr(obj, name)
        if isinstance(value, bool):
            setattr(obj, name, not value)
        elif isinstance(value, (int, float)):
            setattr(obj, name, value + 7)
        elif isinstance(value, list):
            value.append((None, 1))
        elif isinstance(value, StepShape):
            _dirty(value)
        else:
            raise AssertionError(f"{name}: a field of a kind this test does not dirty ({type(value).__name__})")


def test_reset_is_a_fresh_output():
    out, fresh = SchedulerOutput(), SchedulerOutput()
    _dirty(out)
    assert all(getattr(out, name) != getattr(fresh, name) for name in _fields(fresh))  # (every field dirtied)
    out.reset()
    for name in _fields(fresh):
        assert getattr(out, name) == getattr(fresh, name), name
    assert out.shape == StepShape()


def _run(workload, config, batch_runs, hook):
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs)
    if hook:
        sim.core.schedule_hook = lambda out: None  # (keeps nothing, but turns reuse off)
    result = sim.run()
    return sim, result


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_reuse_gives_the_same_tables(workload, config_and_runs):
    config, batch_runs = config_and_runs
    reused, on = _run(workload, config, batch_runs, hook=False)
    fresh, off = _run(workload, config, batch_runs, hook=True)
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)
    assert reused.core.scheduler._spare is not None and fresh.core.scheduler._spare is None


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(with_clients=True), config_and_runs=configs())
def test_an_observed_output_is_kept_as_it_was(workload, config_and_runs):
    config, batch_runs = config_and_runs
    seen: list[tuple[SchedulerOutput, list, int, int]] = []

    def observer(iteration, now, out):
        seen.append((out, list(out.scheduled), out.decode_tokens, out.shape.num_seqs))

    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs, observer=observer)
    sim.run()
    assert len({id(out) for out, *_ in seen}) == len(seen)
    for out, scheduled, decode_tokens, num_seqs in seen:
        assert (out.scheduled, out.decode_tokens, out.shape.num_seqs) == (scheduled, decode_tokens, num_seqs)
