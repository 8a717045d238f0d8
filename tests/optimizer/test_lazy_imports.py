"""Building the CLI loads no heavy dependency, and a simulation loads neither Optuna, SQLAlchemy nor Ray.

Checked in a fresh interpreter through ``sys.modules`` (what was imported), not by timing.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("optuna", "sqlalchemy", "ray", "pandas", "simpy", "plotly", "asyncio")


def _loaded(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_building_the_cli_parser_imports_nothing_heavy():
    loaded = _loaded("from optimizer.cli import build_parser\nbuild_parser().format_help()")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_a_simulation_imports_no_study_machinery():
    loaded = _loaded(
        "from sim.engine.config import EngineConfig\n"
        "from sim.profiles import load_gpu, load_model\n"
        "from sim.runner import simulate\n"
        "from sim.workload import bundled_trace_path, load_trace\n"
        "from objectives import summarize\n"
        "w = load_trace(bundled_trace_path()).head(20)\n"
        "r = simulate(w, EngineConfig(), load_model('Llama-3-8B'), load_gpu('H100-SXM'))\n"
        "summarize(r.requests, r.steps, w.classes)\n"
    )
    assert "pandas" in loaded and "simpy" in loaded  # the probe did simulate
    assert not loaded & {"optuna", "sqlalchemy", "ray"}, sorted(loaded & {"optuna", "sqlalchemy", "ray"})


def test_lazy_package_exports_resolve():
    import optimizer
    import optimizer.report
    import sim.workload

    for package in (optimizer, optimizer.report, sim.workload):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


def test_a_builtin_command_loads_no_plugin_and_a_plugin_command_still_parses():
    """kvtune simulate/tune/... parse without the plugins' subcommands (issue 34: ~0.1 s of a process's start);
    no command, --help, or any other name builds the whole parser."""
    probe = ("from optimizer.cli import main\nimport sys\n"
             "try:\n    main(['{cmd}', '--help'])\nexcept SystemExit:\n    pass\n")
    for cmd in ("simulate", "tune", "export", "report", "workload"):
        loaded = _loaded(probe.format(cmd=cmd))
        assert "replay" not in loaded, cmd
    assert "replay" in _loaded(probe.format(cmd="twin"))
    assert "replay" in _loaded("from optimizer.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n")


def test_the_program_skips_the_exit_collections_and_an_in_process_call_does_not():
    """kvtune run as a program freezes the collector's objects before exit (optimizer/cli.py, issue 34: ~0.13 CPU s
    of a simulate process); main(argv) in-process (tests, embedding) leaves the collector as it was."""
    import gc
    from pathlib import Path

    from optimizer.cli import main

    trace = Path(__file__).resolve().parents[1] / "sim" / "workload" / "data" / "mooncake_trace_sample.jsonl"
    frozen = gc.get_freeze_count()
    assert main(["workload", "describe", str(trace)]) == 0
    assert gc.get_freeze_count() == frozen
    code = ("import gc, sys\nfrom optimizer.cli import main\n"
            f"sys.argv = ['kvtune', 'workload', 'describe', {str(trace)!r}]\n"
            "assert main() == 0\nprint(gc.get_freeze_count() > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "True"


def test_simulate_imports_with_the_collector_paused_and_leaves_it_as_it_was():
    """kvtune simulate imports pandas, pyarrow and the engine with the cyclic collector off, then moves what they
    allocated to its oldest generation (optimizer.cli_simulate._imports_uncollected, issue 34); the collector is on
    again after, nothing stays frozen, and where it was off it stays off."""
    import gc

    from optimizer.cli_simulate import _imports_uncollected

    assert gc.isenabled() and gc.get_freeze_count() == 0
    with _imports_uncollected():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with _imports_uncollected():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
