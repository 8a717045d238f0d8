"""``BaseScheduler.run_block_limit`` (no decode columns) counts each running request's first block-opening step
residue straight from the request, ``(1 - tokens) % B``, as a mask where ``B`` is a power of two and a remainder
otherwise (a config takes powers of two only, 8-128; other sizes are set on the scheduler here so that the
remainder is checked too); it must give :func:`block_limit`'s step over the same token counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.engine.request import Request
from sim.engine.scheduler_base import block_limit
from sim.engine.scheduler_v1 import V1Scheduler


@settings(max_examples=200, deadline=None)
@given(block_size=st.integers(1, 40),
       requests=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 500)), max_size=60),
       free=st.integers(-3, 400), limit=st.integers(1, 300))
def test_run_block_limit_is_block_limit_of_the_running_tokens(block_size, requests, free, limit):
    config = EngineConfig(block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192).resolve(8192)
    scheduler = V1Scheduler(config, 1000, 0)
    scheduler.block_size = block_size
    for i, (prompt, output) in enumerate(requests):
        req = Request(i, i, "a", 0.0, prompt, output + 1, 8192)
        req.num_output_tokens = output
        scheduler.running.append(req)
    tokens = [prompt + output for prompt, output in requests]
    assert scheduler.run_block_limit(free, limit) == block_limit(tokens, block_size, free, limit)
