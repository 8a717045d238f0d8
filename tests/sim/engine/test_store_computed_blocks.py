"""``BaseScheduler._store_computed_blocks`` (write-through offload: each step's scheduled requests' full blocks to the
CPU tier) stores a step whose blocks exceed the tier's capacity itself, one ``CpuBlockTier.put`` per request, without
building the lists of keys and counts; it must leave the tier as ``CpuBlockTier.store_step`` of those lists does (the
slow path, and the path of a step within the capacity), step after step, with the same copies counted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.engine.kv_cache import CpuBlockTier
from sim.engine.request import Request
from sim.engine.scheduler_output import SchedulerOutput
from sim.engine.scheduler_v1 import V1Scheduler

# A step: (request, blocks held (0: none, not stored), computed tokens) for distinct requests.
_step = st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.integers(0, 700)), max_size=12,
                 unique_by=lambda t: t[0])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(block_size=st.sampled_from([1, 3, 8, 16, 17, 32]), capacity=st.integers(1, 80),
       steps=st.lists(_step, max_size=12))
def test_a_steps_store_equals_store_step_of_its_lists(block_size, capacity, steps):
    config = EngineConfig(block_size=16, max_num_seqs=256, max_num_batched_tokens=8192,
                          max_model_len=8192).resolve(8192)
    scheduler = V1Scheduler(config, 1000, capacity)
    assert scheduler.write_through
    scheduler.block_size = block_size
    reference = CpuBlockTier(capacity)
    requests = {}
    for step in steps:
        out = SchedulerOutput()
        keys, fulls = [], []
        for i, holds, computed in step:
            req = requests.setdefault(i, Request(300 + i, 300 + i, "a", 0.0, 1000, 100, 8192))
            req.num_computed_tokens = computed
            req.blocks = -(-computed // block_size) + 1 if holds else 0
            out.scheduled.append((req, 1))
            if holds:
                keys.append(req.index)
                fulls.append(computed // block_size)
        scheduler._store_computed_blocks(out)
        assert out.swap_out_blocks == (reference.store_step(keys, fulls) if keys else 0)
        assert scheduler.cpu.entries() == reference.entries()
        assert scheduler.cpu.num_blocks == reference.num_blocks
    assert [scheduler.cpu.take_copied(300 + i) for i in range(41)] == [reference.take_copied(300 + i) for i in range(41)]
