"""No stale ``Request`` state can be read while a request sits in the decode columns (sim/engine/decode_columns.py).

While a request is in the columns, the arrays are its state: its attributes ``STALE_ATTRIBUTES`` hold
``STALE_INT`` / ``STALE_FLOAT`` until a sync point writes them back.  Code outside the engine reads them through
a sync point: the engine's hooks (``EngineCore.schedule_hook``, ``BaseScheduler.abort_hook``) are called with them
written back (``EngineCore.step_hook`` too), and ``BaseScheduler.sync_requests()`` writes them back between steps.

Here every attribute of every live request is read after every step (``EngineCore.step_hook``) and after every
``schedule()`` (``schedule_hook``: all but the two counted in flight, see decode_columns.py), and every aborted
request's as it is aborted (``abort_hook``), on the fixed matrix of
tests/sim/engine/test_compiled_engine.py with the decode columns on from 8 running requests, and compared with the
engine that keeps no columns (the object path, where nothing can be stale), run by the pure-Python engine
(``KVTUNE_PURE_PYTHON=1 NUMBA_DISABLE_JIT=1``) in a subprocess.
"""

from __future__ import annotations

import ast
import math
import os
import pickle
import subprocess
import sys

import pytest

from sim import _compiled
from sim.engine.decode_columns import STALE_ATTRIBUTES, STALE_FLOAT, STALE_INT, DecodeColumns
from sim.engine.request import Request
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.test_compiled_engine import MATRIX_COLUMNS_MIN, ROOT, _matrix


def _slots() -> tuple[str, ...]:
    """``Request.__slots__`` as written in its source (a mypyc-compiled class has no ``__slots__``)."""
    tree = ast.parse((ROOT / "sim" / "engine" / "request.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("Request.__slots__ not found")


#: Every attribute but the scheduler's cached decode entry (made on demand, not state).
ATTRIBUTES = tuple(a for a in _slots() if a != "decode_entry")


#: Counted at schedule time or at the update as the object path's fast path or general loop takes a decode (see
#: sim/engine/decode_columns.py): compared between steps only.
IN_FLIGHT = ("processed_tokens", "appended_tokens")


def _snapshot(req: Request, names: tuple[str, ...] = ATTRIBUTES) -> str:
    values = []
    for name in names:
        value = getattr(req, name)
        if name == "block_ids":
            # (how many: which of the pool's slots hold them is the pool's choice, and differs between the
            # column and object paths of the prefix pool without changing any hit, eviction or table)
            value = len(value)
        elif name == "status":
            value = value.value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)  # (the pure-Python engine may keep an int where mypyc's attribute is a float)
        values.append(value)
    return repr(tuple(values))  # (repr: floats exactly, NaN equal to NaN)


def read_every_step(case: tuple, columns: int | None) -> dict[str, list]:
    """Snapshots of every live request after every ``schedule()`` and of every aborted request as it is aborted."""
    workload, config, batch_runs, latency, *_ = case
    kwargs = {"latency": LinearStepModel(0.01, 1e-5), "hash_block_tokens": 512} if latency == "linear" else {}
    if latency == "roofline" and "hash_ids" in workload.requests.columns:
        kwargs["hash_block_tokens"] = 64
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     batch_decode_runs=batch_runs, decode_columns=columns is not None, **kwargs)
    scheduler = sim.core.scheduler
    if columns is not None:
        scheduler.use_decode_columns(columns)
    steps: list[tuple[int, list[str]]] = []
    scheduled: list[list[str]] = []
    aborts: list[str] = []
    segments = [0]
    # (``appended_tokens`` is V0's block table; V1 never reads it, and only its fast path writes it)
    exact = ATTRIBUTES if config.flavor == "vllm-v0" else tuple(a for a in ATTRIBUTES if a != "appended_tokens")
    settled = tuple(a for a in exact if a not in IN_FLIGHT)

    def step_hook(iteration: int) -> None:
        steps.append((iteration, [_snapshot(r, exact) for r in scheduler.live_requests()]))

    def schedule_hook(out) -> None:
        segments[0] = max(segments[0], out.columnar)
        scheduled.append([_snapshot(r, settled) for r in scheduler.live_requests()])

    def abort_hook(req, status, now) -> None:
        # (async scheduling aborts between schedule() and the update, as vLLM 0.33 does: EngineCore.abort_due)
        aborts.append(_snapshot(req, settled if scheduler.async_scheduling else exact))

    sim.core.step_hook = step_hook
    sim.core.schedule_hook = schedule_hook
    scheduler.abort_hook = abort_hook
    sim.run()
    return {"steps": steps, "scheduled": scheduled, "aborts": aborts, "segment": segments[0]}


_PURE = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from tests.sim.engine.test_stale_state import read_every_step
with open(sys.argv[2], "rb") as f:
    cases = pickle.load(f)
with open(sys.argv[3], "wb") as f:
    pickle.dump([read_every_step(case, None) for case in cases], f)
"""


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """{name: (with decode columns here, object path in the pure-Python engine)}."""
    matrix = _matrix()
    mine = [read_every_step(case, MATRIX_COLUMNS_MIN) for case in matrix.values()]
    folder = tmp_path_factory.mktemp("stale")
    (folder / "cases.pkl").write_bytes(pickle.dumps(list(matrix.values())))
    env = dict(os.environ, **{_compiled.ENV: "1", "NUMBA_DISABLE_JIT": "1"})
    subprocess.run([sys.executable, "-c", _PURE, str(ROOT), str(folder / "cases.pkl"), str(folder / "out.pkl")],
                   check=True, env=env, cwd=ROOT)
    pure = pickle.loads((folder / "out.pkl").read_bytes())
    return dict(zip(matrix, zip(mine, pure)))


@pytest.mark.parametrize("name", tuple(_matrix()))
def test_every_request_attribute_read_mid_run_matches_the_object_path(reads, name):
    mine, pure = reads[name]
    if name != "v1-priority":  # (the priority policy keeps no columns)
        assert mine["segment"] > 0, "the decode columns never held a request: nothing tested"
    assert len(mine["steps"]) == len(pure["steps"]) > 0
    for (iteration, got), (_, want) in zip(mine["steps"], pure["steps"]):
        assert got == want, f"{name}: live requests' attributes differ after step {iteration}"
    assert len(mine["scheduled"]) == len(pure["scheduled"])
    for i, (got, want) in enumerate(zip(mine["scheduled"], pure["scheduled"])):
        assert got == want, f"{name}: live requests' attributes differ after schedule() call {i}"
    assert mine["aborts"] == pure["aborts"]
    if name == "v1-client-timeouts":
        assert mine["aborts"], "no abort read"


def _steady(index: int, computed: int) -> Request:
    req = Request(index, index, "a", 0.0, 20, 100, 4096)
    req.num_computed_tokens = req.high_water = req.appended_tokens = req.processed_tokens = computed
    req.num_output_tokens = computed + 1 - 20
    req.blocks = req.kv_blocks_peak = -(-computed // 16)
    req.last_token_s, req.max_itl_s, req.time_decode_s, req.time_overhead_s = 1.0, 0.5, 0.25, 0.125
    return req


def test_a_request_in_the_columns_reads_as_stale_until_synced():
    cols = DecodeColumns(16)
    reqs = [_steady(i, 24 + i) for i in range(3)]
    before = [[getattr(r, a) for a in STALE_ATTRIBUTES] for r in reqs]
    cols.join(reqs)
    for req in reqs:
        for name in STALE_ATTRIBUTES:
            value = getattr(req, name)
            assert value == STALE_INT if isinstance(value, int) else (math.isinf(value) and value == STALE_FLOAT), name
    cols.sync()
    assert [[getattr(r, a) for a in STALE_ATTRIBUTES] for r in reqs] == before
    cols.poison()
    assert all(r.num_computed_tokens == STALE_INT for r in reqs)
    # In the middle of a step that scheduled the first two, their next token's block is allocated.
    cols.sync(None, 2)
    assert [r.blocks for r in reqs] == [-(-(24 + i + 1) // 16) if i < 2 else -(-(24 + i) // 16) for i in range(3)]
