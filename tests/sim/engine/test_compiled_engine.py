"""The compiled engine (mypyc, sim/_compiled.py) decides exactly as the interpreted sources do.

Every other engine test runs the compiled engine when it is built (CI builds it: ``pip install -e .``).  Here the
same runs go through both: random small workloads and configs of both flavors (the invariant properties'
strategies, drawn deterministically), plus trace-based runs under the roofline latency model with preemption,
CPU offload, prefix caching and V0 swap; the interpreted side runs in a subprocess with ``KVTUNE_PURE_PYTHON=1``.
Request and step tables must be equal exactly, floats included.  The stale-build check is tested on a made-up
tree.
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
from sim.workload import bundled_trace_path, load_trace
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


def _trace_cases() -> list[tuple]:
    """The bundled trace's first 400 requests at 4x under the roofline model, on a small KV cache (preemptions)."""
    full = load_trace(bundled_trace_path()).scale_rate(4.0)
    requests = full.requests.head(400).reset_index(drop=True)
    trace = full.with_requests(requests)
    hashed = requests.copy()
    hashed["hash_ids"] = [[i % 7, 100 + i % 3] + [1000 + 10 * i + j for j in range(2)] for i in range(len(hashed))]
    small = dict(num_gpu_blocks_override=900, max_num_seqs=64)
    return [
        (trace, EngineConfig(**small), True, "roofline"),
        (trace, EngineConfig(**small, kv_offloading_size_gb=1.0), True, "roofline"),
        (full.with_requests(hashed), EngineConfig(**small, enable_prefix_caching=True), True, "roofline"),
        (trace, EngineConfig(**small, flavor="vllm-v0", preemption_mode="swap", swap_space_gb=4), True, "roofline"),
        (trace, EngineConfig(**small, async_scheduling=True), False, "roofline"),
    ]


def run_case(case: tuple) -> tuple:
    workload, config, batch_runs, latency = case
    kwargs = {"latency": LinearStepModel(0.01, 1e-5), "hash_block_tokens": 512} if latency == "linear" else {}
    result = Simulation(workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
                        batch_decode_runs=batch_runs, **kwargs).run()
    return result.requests, result.steps, result.num_iterations


_INTERPRETED = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
from sim import _compiled
assert _compiled.state() == "interpreted", _compiled.state()
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


@needs_compiled
def test_compiled_and_interpreted_engines_give_the_same_tables(tmp_path):
    cases = _random_cases() + _trace_cases()
    compiled = [run_case(case) for case in cases]
    (tmp_path / "cases.pkl").write_bytes(pickle.dumps(cases))
    env = dict(os.environ, **{_compiled.ENV: "1"})
    subprocess.run([sys.executable, "-c", _INTERPRETED, str(ROOT), str(tmp_path / "cases.pkl"),
                    str(tmp_path / "out.pkl")], check=True, env=env, cwd=ROOT)
    interpreted = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert len(interpreted) == len(cases)
    for i, (mine, theirs) in enumerate(zip(compiled, interpreted)):
        requests, steps, iterations = mine
        assert iterations == theirs[2], f"case {i}: {cases[i][1]}"
        pd.testing.assert_frame_equal(requests, theirs[0], check_exact=True, obj=f"case {i} requests")
        pd.testing.assert_frame_equal(steps, theirs[1], check_exact=True, obj=f"case {i} steps")
    # The comparison covers the paths that matter: every trace case preempts (V0's swaps out, the offload case
    # stores to its CPU tier).  (Not a count over the random cases: hypothesis's draws, derandomized, still
    # differ between a lone run and the whole suite's process.)
    trace = compiled[-len(_trace_cases()):]
    assert all(int(requests["num_preemptions"].sum()) > 0 for requests, _, _ in trace)
    assert int(trace[1][0]["swapped_out_blocks"].sum()) > 0 and int(trace[3][0]["swapped_out_blocks"].sum()) > 0


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
