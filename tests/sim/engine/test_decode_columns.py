"""The decode columns (sim/engine/decode_columns.py: the running batch's steady decodes as numpy arrays) give
exactly the tables of the Request-object path, over random V1 workloads (and V0 ones without chunked prefill,
recompute or swap) that exercise joining, finishing, timeouts and cancels (a running request aborted out of the
columns), preemption (on the columns in V1; the columns written back before the general loop in V0), shared
prefixes (hashing from the columns), write-through CPU offload (stored from the columns), async scheduling and
batched runs."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.config import EngineConfig
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from sim.workload.classes import RequestClass
from tests.sim.engine.conftest import make_workload

MAX_MODEL_LEN = 256


@st.composite
def cases(draw):
    n = draw(st.integers(10, 60))
    rows, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0, 0.005, 0.05]))
        rows.append((t, draw(st.integers(1, 150)), draw(st.integers(1, 100)), draw(st.sampled_from(["a", "b"]))))
    classes = {
        "a": RequestClass("a", timeout_s=draw(st.sampled_from([None, 0.2, 1.0]))),
        "b": RequestClass("b", cancel_probability=draw(st.sampled_from([0.0, 0.3])), cancel_after_s=(0.0, 1.0)),
    }
    workload = make_workload(rows, classes)
    shared = draw(st.booleans())
    if shared:
        workload.requests["hash_ids"] = [[i % 3, 10 + i % 2] if i % 4 else [] for i in range(n)]
    block_size = draw(st.sampled_from([8, 16]))
    min_blocks = MAX_MODEL_LEN // block_size + 1
    config = EngineConfig(
        block_size=block_size, max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=draw(st.integers(min_blocks, min_blocks * 8)),
        max_num_seqs=draw(st.integers(4, 48)),
        max_num_batched_tokens=draw(st.sampled_from([64, 256, 1024])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 24])),
        enable_prefix_caching=shared or draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.05])),
        # A CPU tier (write-through offload, stored from the columns): ~5, ~25 or ~250 blocks of 1-2 MiB.
        kv_offloading_size_gb=draw(st.sampled_from([None, None, 0.01, 0.05, 0.5])),
    )
    return workload, config, draw(st.booleans()), draw(st.integers(2, 8))


def _run(workload, config, batch_runs, columns_min):
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=batch_runs, hash_block_tokens=64,
                     decode_columns=columns_min is not None)
    if columns_min is not None:
        scheduler = sim.core.scheduler
        scheduler.use_decode_columns(columns_min)

        def checked(out):
            # The fast path's leading entries (the segment's kept from step to step by the columns) are the
            # leading running requests, one token each, as the object path would list them.
            bulk = out.scheduled[:out.bulk_decode]
            assert [r for r, _ in bulk] == scheduler.running[:out.bulk_decode]
            assert all(n == 1 for _, n in bulk)
            checks[0] += 1

        checks = [0]
        sim.core.schedule_hook = checked
        result = sim.run()
        assert checks[0] > 0
        return sim, result
    return sim, sim.run()


@st.composite
def v0_cases(draw):
    """The V0 flavor without chunked prefill (where it keeps columns), recompute or swap preemption."""
    workload, v1, batch_runs, columns_min = draw(cases())
    workload = workload.with_requests(workload.requests.drop(columns=["hash_ids"], errors="ignore"))
    config = EngineConfig(
        flavor="vllm-v0", block_size=v1.block_size, max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=False,
        num_gpu_blocks_override=v1.num_gpu_blocks_override, max_num_seqs=v1.max_num_seqs,
        max_num_batched_tokens=max(MAX_MODEL_LEN, v1.max_num_batched_tokens),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])), swap_space_gb=4,
    )
    return workload, config, batch_runs, columns_min


def _check(case):
    workload, config, batch_runs, columns_min = case
    _, slow = _run(workload, config, batch_runs, None)
    sim, fast = _run(workload, config, batch_runs, columns_min)
    pd.testing.assert_frame_equal(slow.requests, fast.requests, check_exact=True)
    pd.testing.assert_frame_equal(slow.steps, fast.steps, check_exact=True)
    assert slow.num_iterations == fast.num_iterations
    assert len(sim.core.scheduler._columns) == 0, "written back at the end of the run"


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_decode_columns_give_the_object_paths_tables(case):
    _check(case)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=v0_cases())
def test_v0_decode_columns_give_the_object_paths_tables(case):
    _check(case)


def _columns_from(sim, min_batch: int) -> list[int]:
    """Turn the decode columns on; the returned list gets each step's segment length."""
    sim.core.scheduler.use_decode_columns(min_batch)
    seen: list[int] = []
    sim.core.schedule_hook = lambda out: seen.append(out.columnar)
    return seen


@pytest.mark.parametrize("flavor", ["vllm-v1", "vllm-v0"])
def test_the_columns_take_on_a_large_batch(flavor):
    # 64 requests decoding together: the columns hold them (the properties above would pass vacuously if not).
    workload = make_workload([(0.0, 20, 200)] * 64)
    config = EngineConfig(flavor=flavor, max_num_seqs=64, max_model_len=MAX_MODEL_LEN)
    sim = Simulation(workload, config, load_model("Llama-3-8B"),
                     load_gpu("H100-SXM"), latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=False)
    seen = _columns_from(sim, 32)
    table = sim.run().requests
    assert max(seen) == 64
    assert (table["generated_tokens"] == 200).all()


@pytest.mark.parametrize("size_gb", [0.02, 1.0])
def test_write_through_offload_stores_from_the_columns(size_gb):
    # 64 requests decoding together on a CPU tier smaller (0.02 GiB: 10 blocks of 2 MiB, each store evicting
    # others) or larger than their blocks: the columns hold them, and the blocks stored from the columns are the
    # object path's (per request and per step).
    workload = make_workload([(0.0, 20, 200)] * 64)
    config = EngineConfig(max_num_seqs=64, max_model_len=MAX_MODEL_LEN, kv_offloading_size_gb=size_gb)
    tables, seen = [], []
    for columns in (False, True):
        sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                         latency=LinearStepModel(0.01, 1e-5), batch_decode_runs=False, decode_columns=False)
        scheduler = sim.core.scheduler
        assert scheduler.write_through
        if columns:
            seen = _columns_from(sim, 32)
        tables.append(sim.run())
    assert max(seen) == 64
    slow, fast = tables
    assert slow.requests["swapped_out_blocks"].sum() > 0
    pd.testing.assert_frame_equal(slow.requests, fast.requests, check_exact=True)
    pd.testing.assert_frame_equal(slow.steps, fast.steps, check_exact=True)


_COLD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from sim.engine import decode_columns
from sim.engine.config import EngineConfig
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.conftest import make_workload

def columns(config, **kwargs):
    workload = make_workload([(0.0, 20, 200)] * 64)
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     latency=LinearStepModel(0.01, 1e-5), **kwargs)
    return sim.core.scheduler._columns is not None

plain = EngineConfig(max_num_seqs=64, max_model_len=4096)
Simulation(make_workload([(0.0, 20, 200)] * 64), plain, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
           latency=LinearStepModel(0.01, 1e-5)).run()
# Shared prefixes (the prefix pool) and a write-through CPU tier, both of which evict.
shared = make_workload([(0.001 * i, 300, 100) for i in range(64)])
shared.requests["hash_ids"] = [[i % 3, 10 + i % 2] for i in range(64)]
cached = EngineConfig(max_num_seqs=64, max_model_len=4096, block_size=16, enable_prefix_caching=True,
                      num_gpu_blocks_override=600, kv_offloading_size_gb=0.01)
tables = Simulation(shared, cached, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                    latency=LinearStepModel(0.01, 1e-5)).run()
assert tables.requests["prefix_hit_tokens"].sum() > 0 and tables.requests["swapped_out_blocks"].sum() > 0
print("numba" in sys.modules)
print(columns(plain), columns(plain, decode_columns=True),
      columns(EngineConfig(max_num_seqs=64, max_model_len=4096, kv_offloading_size_gb=1.0)),
      decode_columns.worth_loading(decode_columns.COLD_MIN_REQUESTS), "sim.engine._column_kernels" in sys.modules
      and decode_columns._loaded[0])
decode_columns.warm_up()
print(columns(plain))
"""


def test_a_cold_process_keeps_decode_columns_only_where_loading_their_kernels_pays():
    # Loading the column kernels costs a fresh process ~0.3 CPU s (numba's first kernel); by default a small run
    # there keeps no columns (same tables) and imports no numba at all, shared prefixes and a CPU tier included
    # (their loops are mypyc's since issue 34), unless it asks for them; once loaded (a study worker's warm-up),
    # every run keeps them.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", _COLD, str(root)], check=True, capture_output=True, text=True,
                         cwd=root).stdout.split("\n")
    assert out[0] == "False", "a run imported numba"
    assert out[1] == "False True False True False", out
    assert out[2] == "True", out
