"""kvtune simulator: workloads, the engine model (schedulers, KV blocks, latency) and the run loop."""

from sim import _compiled

# Before any engine module is imported: the compiled engine, unless its build is older than the sources.
_compiled.install()

from sim._lazy import lazy_getattr  # noqa: E402

#: Public names, imported on first use (after the check above).
_EXPORTS = {
    "BuiltEngine": "sim.engine.build",
    "EngineConfig": "sim.engine.config",
    "EnginePlan": "sim.engine.build",
    "build_engine": "sim.engine.build",
    "resolve_engine": "sim.engine.build",
    "simulate": "sim.runner",
    "SimResult": "sim.runner",
    "Simulation": "sim.runner",
}

#: ``lazy_getattr(module, {name: module path})``: the module ``__getattr__`` other packages use for the same lazy
#: public names (replay/).
__all__ = sorted([*_EXPORTS, "compiled_state", "lazy_getattr"])


def compiled_state() -> str:
    """Which engine this process runs: compiled (mypyc) or interpreted, and why (``sim/_compiled.py``)."""
    return _compiled.state()


__getattr__ = lazy_getattr(__name__, _EXPORTS)
