"""The KV-pressure incident on the Azure conversation trace (Llama-3-8B, one L40S, 1.25x arrival rate).

Raising ``max_num_seqs`` lets more sequences share a nearly full cache, so more of them get preempted and
recompute their prefix; reserving KV for running sequences stops admissions from eating the room they grow
into.  Direction of p99/throughput is reported in benchmarks/README.md (benchmarks/incident_sweep.py), not asserted.
"""

from __future__ import annotations

import pytest

from objectives import summarize
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload import bundled_trace_path, load_trace


@pytest.fixture(scope="module")
def incident_workload():
    return load_trace(bundled_trace_path()).head(4000).scale_rate(1.25)


def _recompute_share(workload, **knobs) -> float:
    result = simulate(workload, EngineConfig(**knobs), load_model("Llama-3-8B"), load_gpu("L40S"))
    return summarize(result.requests, result.steps, workload.classes).to_dict()["recompute_token_share"]


def test_more_sequences_recompute_more_and_reserve_recomputes_less(incident_workload):
    low = _recompute_share(incident_workload, max_num_seqs=64)
    high = _recompute_share(incident_workload, max_num_seqs=256)
    reserved = _recompute_share(incident_workload, max_num_seqs=256, reserved_kv_fraction=0.2)
    assert high > low, (low, high)
    assert high > 0.005, "the cache should be under real pressure at this rate"
    assert reserved < high, (reserved, high)
