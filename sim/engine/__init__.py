"""The engine model: configs, KV sizing, schedulers and the core that steps them.

Build an engine with :func:`build_engine` (or :func:`resolve_engine`, then :meth:`EnginePlan.build` per fresh
core).  Names are imported on first use, so that importing one engine module does not import them all.
"""

from __future__ import annotations

from sim._lazy import lazy_getattr

_EXPORTS = {
    "BuiltEngine": "sim.engine.build",
    "ConfigSource": "sim.engine.build",
    "EngineConfig": "sim.engine.config",
    "EnginePlan": "sim.engine.build",
    "KVSizing": "sim.engine.sizing",
    "build_engine": "sim.engine.build",
    "resolve_engine": "sim.engine.build",
    "roofline_for": "sim.engine.build",
    "release_record": "sim.engine.defaults",
    "size_kv_cache": "sim.engine.sizing",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
