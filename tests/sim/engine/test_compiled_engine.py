"""The accelerated engine (mypyc's compiled modules, sim/_compiled.py, and numba's kernels,
sim/engine/_column_kernels.py) decides exactly as the pure-Python sources do.

Every other engine test runs the compiled engine when it is built (CI builds it: ``pip install -e .``).  Here the
same runs go through both: the accelerated engine in this process, the pure-Python one in a subprocess with
``KVTUNE_PURE_PYTHON=1`` (the mypyc modules' sources) and ``NUMBA_DISABLE_JIT=1`` (numba runs the kernels' Python).
Request and step tables must be equal exactly, floats included, on

- a fixed matrix (``MATRIX``): V0 recompute, V0 swap, V1 recompute, V1 with prefix caching, V1 CPU offload (a
  tier that loads blocks back, and one whose LRU evicts), async scheduling, the priority policy, client timeouts
  and cancels; small workloads under the roofline latency model that preempt, with the decode columns on from 8
  running requests so that the column kernels run (the priority policy keeps them off, as the engine does); a
  test checks that each case exercises what it names;
- random small workloads and configs of both flavors (the invariant properties' strategies, drawn
  deterministically).

Each layer also runs switched off alone on the matrix (``NUMBA_DISABLE_JIT=1`` under the compiled engine,
``KVTUNE_PURE_PYTHON=1`` with numba on), with the same tables.  The stale-build check is tested on a made-up tree.
How the fast paths work: benchmarks/speed/README.md, "The accelerated engine".
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from sim import _compiled
from sim.engine.config import EngineConfig
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from tests.sim.engine.test_invariants import configs, shared_prefix_workloads, workloads

ROOT = Path(__file__).resolve().parents[3]

needs_compiled = pytest.mark.skipif(
    _compiled.state() != "compiled" and not os.environ.get("CI"),
    reason="the compiled engine is not built here (pip install -e . builds it; CI requires it)")


def _random_cases(count: int = 60) -> list[tuple]:
    """(workload, config, batch_runs, latency kind) drawn by the invariant properties' strategies, the same draws
    on every run (derandomized)."""
    cases: list[tuple] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(workload=workloads(with_clients=True), config_and_runs=configs())
    def plain(workload, config_and_runs):
        cases.append((workload, *config_and_runs, "linear"))

    @settings(max_examples=count // 3, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(workload=shared_prefix_workloads(with_clients=True), config_and_runs=configs())
    def shared(workload, config_and_runs):
        cases.append((workload, *config_and_runs, "linear"))

    plain()
    shared()
    return cases


#: Decode columns from this many running requests in the matrix (the engine's default, 48, needs larger batches).
MATRIX_COLUMNS_MIN = 8


def _matrix_workload(timeouts: bool = False, hashed: bool = False):
    """96 requests in bursts over ~1 s (prompts 16-480, outputs 8-240 tokens, seeded), classes ``a`` (priority 0)
    and ``b`` (priority 1); with ``timeouts``, ``a`` times out after 0.4 s and half of ``b`` cancel within
    0.4 s; with ``hashed``, Mooncake-style ``hash_ids`` (64-token blocks, one of 4 shared system prompts of 1-3
    blocks, the rest unique)."""
    import numpy as np

    from sim.workload.classes import RequestClass
    from tests.sim.engine.conftest import make_workload

    rng = np.random.default_rng(33)
    n = 96
    arrivals = np.sort(rng.choice(np.linspace(0.0, 1.0, 12), n))
    prompts = rng.integers(16, 481, n)
    outputs = rng.integers(8, 241, n)
    rows = [(float(t), int(p), int(o), "ab"[i % 2]) for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs))]
    if timeouts:
        classes = {"a": RequestClass("a", timeout_s=0.4, priority=0),
                   "b": RequestClass("b", cancel_probability=0.5, cancel_after_s=(0.0, 0.4), priority=1)}
    else:
        classes = {"a": RequestClass("a", priority=0), "b": RequestClass("b", priority=1)}
    workload = make_workload(rows, classes)
    if hashed:
        ids, unique = [], 1000
        for i, prompt in enumerate(prompts):
            blocks = -(-int(prompt) // 64)
            shared = min(1 + i % 3, blocks)
            ids.append([4 * (i % 4) + j for j in range(shared)] + list(range(unique, unique + blocks - shared)))
            unique += blocks - shared
        workload.requests["hash_ids"] = ids
    return workload


def _matrix() -> dict[str, tuple]:
    """name -> (workload, config, batch_runs, latency kind, decode columns from): the fixed matrix."""
    plain, timed, hashed = _matrix_workload(), _matrix_workload(timeouts=True), _matrix_workload(hashed=True)
    # ~2,600 tokens of KV (164 blocks of 16) for up to 32 running requests of up to 720 tokens: every case preempts.
    small = dict(num_gpu_blocks_override=164, max_num_seqs=32, max_model_len=768, max_num_batched_tokens=512)
    v0 = dict(small, flavor="vllm-v0", enable_chunked_prefill=False, max_num_batched_tokens=1024)
    cases = {
        "v0-recompute": (plain, EngineConfig(**v0, preemption_mode="recompute")),
        "v0-swap": (plain, EngineConfig(**v0, preemption_mode="swap", swap_space_gb=4)),
        "v1-recompute": (plain, EngineConfig(**small, enable_prefix_caching=False)),
        "v1-prefix-caching": (hashed, EngineConfig(**small, enable_prefix_caching=True)),
        # 256 blocks of CPU tier (2 MiB each): preempted requests load blocks back; 64 blocks: its LRU evicts
        # (every preempted request's blocks are gone by its resume).
        "v1-cpu-offload": (plain, EngineConfig(**small, kv_offloading_size_gb=0.5)),
        "v1-cpu-offload-evicting": (plain, EngineConfig(**small, kv_offloading_size_gb=0.125)),
        "v1-async-scheduling": (plain, EngineConfig(**small, async_scheduling=True)),
        "v1-priority": (plain, EngineConfig(**small, scheduling_policy="priority")),
        "v1-client-timeouts": (timed, EngineConfig(**small)),
    }
    return {name: (workload, config, True, "roofline", MATRIX_COLUMNS_MIN)
            for name, (workload, config) in cases.items()}


MATRIX = tuple(_matrix())


def run_case(case: tuple) -> tuple:
    """(requests, steps, iterations, the largest decode-column segment a step had)."""
    workload, config, batch_runs, latency, *columns = case
    kwargs = {"latency": LinearStepModel(0.01, 1e-5), "hash_block_tokens": 512} if latency == "linear" else {}
    if latency == "roofline" and "hash_ids" in workload.requests.columns:
        kwargs["hash_block_tokens"] = 64
    sim = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                     batch_decode_runs=batch_runs, decode_columns=True, **kwargs)
    if columns and columns[0] is not None:
        sim.core.scheduler.use_decode_columns(columns[0])
    largest = [0]

    def segment(out) -> None:
        largest[0] = max(largest[0], out.columnar)

    sim.core.schedule_hook = segment
    result = sim.run()
    return result.requests, result.steps, result.num_iterations, largest[0]


_INTERPRETED = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from sim import _compiled
assert _compiled.state() == "interpreted", _compiled.state()
import numba
assert numba.config.DISABLE_JIT, "NUMBA_DISABLE_JIT did not reach numba"
from tests.sim.engine.test_compiled_engine import run_case
with open(sys.argv[2], "rb") as f:
    cases = pickle.load(f)
with open(sys.argv[3], "wb") as f:
    pickle.dump([run_case(case) for case in cases], f)
"""


@needs_compiled
def test_ci_runs_the_compiled_engine():
    assert _compiled.state() == "compiled", (
        f"the engine runs {_compiled.state()}: pip install -e . should have built sim/_compiled.COMPILED")
    import sim.engine.core

    assert not sim.engine.core.__file__.endswith(".py")


@pytest.fixture(scope="module")
def both_engines(tmp_path_factory):
    """{"matrix": {name: (accelerated, pure)}, "random": [(case, accelerated, pure)]}: each case run by this
    process's engine and by the pure-Python one (one subprocess for all)."""
    matrix = _matrix()
    random = _random_cases()
    cases = list(matrix.values()) + random
    accelerated = [run_case(case) for case in cases]
    folder = tmp_path_factory.mktemp("pure")
    (folder / "cases.pkl").write_bytes(pickle.dumps(cases))
    env = dict(os.environ, **{_compiled.ENV: "1", "NUMBA_DISABLE_JIT": "1"})
    subprocess.run([sys.executable, "-c", _INTERPRETED, str(ROOT), str(folder / "cases.pkl"),
                    str(folder / "out.pkl")], check=True, env=env, cwd=ROOT)
    pure = pickle.loads((folder / "out.pkl").read_bytes())
    assert len(pure) == len(cases)
    pairs = list(zip(accelerated, pure))
    return {"matrix": dict(zip(matrix, pairs)),
            "random": [(case, *pair) for case, pair in zip(random, pairs[len(matrix):])]}


_ONE_LAYER_OFF = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from sim import _compiled
import numba
assert _compiled.state() == sys.argv[4], _compiled.state()
assert bool(numba.config.DISABLE_JIT) == (sys.argv[5] == "off")
from tests.sim.engine.test_compiled_engine import run_case
with open(sys.argv[2], "rb") as f:
    cases = pickle.load(f)
with open(sys.argv[3], "wb") as f:
    pickle.dump([run_case(case) for case in cases], f)
"""


@pytest.fixture(scope="module")
def one_layer_off(both_engines, tmp_path_factory):
    """{layer: {name: (accelerated, with that layer off alone)}} on the matrix: ``numba`` (``NUMBA_DISABLE_JIT=1``:
    the kernels run as Python under the compiled engine) and ``mypyc`` (``KVTUNE_PURE_PYTHON=1``: the sources,
    with numba's kernels compiled)."""
    matrix = _matrix()
    folder = tmp_path_factory.mktemp("one_layer_off")
    (folder / "cases.pkl").write_bytes(pickle.dumps(list(matrix.values())))
    got = {}
    for layer, env, state, jit in (("numba", {"NUMBA_DISABLE_JIT": "1"}, "compiled", "off"),
                                   ("mypyc", {_compiled.ENV: "1"}, "interpreted", "on")):
        environ = {k: v for k, v in os.environ.items() if k not in (_compiled.ENV, "NUMBA_DISABLE_JIT")}
        out = folder / f"{layer}.pkl"
        subprocess.run([sys.executable, "-c", _ONE_LAYER_OFF, str(ROOT), str(folder / "cases.pkl"), str(out),
                        state, jit], check=True, env=dict(environ, **env), cwd=ROOT)
        runs = pickle.loads(out.read_bytes())
        got[layer] = {name: (both_engines["matrix"][name][0], run) for name, run in zip(matrix, runs)}
    return got


def _assert_same(label: str, mine: tuple, theirs: tuple) -> None:
    requests, steps, iterations, segment = mine
    assert iterations == theirs[2], label
    assert segment == theirs[3], label
    pd.testing.assert_frame_equal(requests, theirs[0], check_exact=True, obj=f"{label} requests")
    pd.testing.assert_frame_equal(steps, theirs[1], check_exact=True, obj=f"{label} steps")


@needs_compiled
@pytest.mark.parametrize("name", MATRIX)
def test_accelerated_and_pure_python_engines_give_the_same_tables(both_engines, name):
    _assert_same(name, *both_engines["matrix"][name])


@needs_compiled
def test_the_matrix_exercises_what_it_names(both_engines):
    # On the accelerated side (the pure side's tables are equal): every case preempts; each feature did its work.
    got = {name: mine for name, (mine, _) in both_engines["matrix"].items()}
    for name, (requests, _steps, _iterations, segment) in got.items():
        assert int(requests["num_preemptions"].sum()) > 0, name
        assert (segment > 0) == (name != "v1-priority"), f"{name}: largest decode-column segment {segment}"
    status = {name: got[name][0]["status"].value_counts() for name in got}
    assert all(status[name].get("finished", 0) == 96 for name in got if name != "v1-client-timeouts")
    assert status["v1-client-timeouts"].get("timed_out", 0) > 0 and status["v1-client-timeouts"].get("cancelled", 0) > 0
    swap = got["v0-swap"][0]
    assert int(swap["swapped_out_blocks"].sum()) > 0 and int(swap["swapped_in_blocks"].sum()) > 0
    assert int(got["v0-recompute"][0]["recomputed_tokens"].sum()) > 0
    assert int(got["v1-cpu-offload"][0]["swapped_in_blocks"].sum()) > 0
    assert int(got["v1-cpu-offload-evicting"][0]["swapped_out_blocks"].sum()) > 100 * 64  # stored past its size
    assert int(got["v1-prefix-caching"][0]["prefix_hit_tokens"].sum()) > 0
    assert int((got["v1-async-scheduling"][1]["num_steps"] > 1).sum()) > 0  # batched decode runs


@needs_compiled
@pytest.mark.parametrize("layer", ("numba", "mypyc"))
def test_each_layer_can_be_switched_off_alone(one_layer_off, layer):
    # NUMBA_DISABLE_JIT alone used to fail on the compiled engine (a kernel run as Python returned numpy.int64
    # where mypyc's typed callers want int; sim/engine/_column_kernels._plain).
    for name, (mine, theirs) in one_layer_off[layer].items():
        _assert_same(f"{name}, {layer} off", mine, theirs)


@needs_compiled
def test_random_small_workloads_give_the_same_tables(both_engines):
    for i, (case, mine, theirs) in enumerate(both_engines["random"]):
        _assert_same(f"random case {i} ({case[1]})", mine, theirs)


def _fake_tree(root: Path, edited: str | None) -> None:
    for name in _compiled.COMPILED:
        source = _compiled.source_path(name, root)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {name}\n")
        source.with_name(source.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    stamp = {"sha256": {name: _compiled.source_hash(_compiled.source_path(name, root)) for name in _compiled.COMPILED}}
    (root / "sim" / _compiled.STAMP).write_text(json.dumps(stamp))
    if edited:
        _compiled.source_path(edited, root).write_text("# edited\n")


def test_an_edited_source_is_run_interpreted_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(_compiled.ENV, raising=False)
    monkeypatch.setattr(_compiled, "_state", _compiled.state())
    _fake_tree(tmp_path, edited=None)
    assert _compiled.stale_sources(tmp_path) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compiled.install(tmp_path) == "compiled"
    _fake_tree(tmp_path, edited="sim.engine.core")
    assert _compiled.stale_sources(tmp_path) == ["sim.engine.core"]
    with pytest.warns(RuntimeWarning, match=r"sim/engine/core\.py changed since the compiled engine was built"):
        assert _compiled.install(tmp_path) == "stale"
    finder = sys.meta_path[0]
    spec = finder.find_spec("sim.engine.scheduler_v1")
    assert spec.origin == str(_compiled.source_path("sim.engine.scheduler_v1", tmp_path))
    assert finder.find_spec("sim.engine.config") is None
    (tmp_path / "sim" / _compiled.STAMP).unlink()
    assert _compiled.stale_sources(tmp_path) == list(_compiled.COMPILED)


def test_pure_python_is_asked_for_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(_compiled, "_state", _compiled.state())
    assert not _compiled.pure_python_requested({_compiled.ENV: "0"})
    assert not _compiled.pure_python_requested({})
    assert _compiled.pure_python_requested({_compiled.ENV: "1"})
    # Nothing built: the sources run as they are, with no finder and no warning.
    (tmp_path / "sim").mkdir()
    before = len(sys.meta_path)
    assert _compiled.install(tmp_path) == "interpreted"
    assert len(sys.meta_path) == before
