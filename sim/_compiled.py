"""The compiled engine: the modules ``setup.py`` compiles with mypyc, and the import-time check that a build is
not stale.

The engine's per-step Python (scheduling, applying outputs, the latency model, the run loop) runs 2-4x faster
compiled by mypyc (``benchmarks/sim_speed.py``; benchmarks/speed/README.md). The compiled modules are the same sources,
so decisions cannot differ; ``tests/sim/engine/test_compiled_engine.py`` compares the compiled and interpreted engines'
tables. A compiled module is an extension file beside its source (``pip install -e .`` builds them in place), and
Python imports an extension before a source of the same name, so a build older than an edited source would run the
old code. :func:`install` (called by ``sim/__init__.py``) therefore checks the sources against the hashes the build
recorded, and runs the interpreted sources (all of them: compiled classes cannot derive from interpreted ones) when
any differs, with a warning that says how to rebuild, or when ``KVTUNE_PURE_PYTHON`` is set. With no extension built
(``KVTUNE_PURE_PYTHON=1 pip install -e .``), the sources run as they are.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

#: Compiled by mypyc, in one group (``setup.py`` reads this tuple without importing ``sim``).
COMPILED = (
    "sim.engine.request",
    "sim.engine.kv_cache",
    "sim.engine.scheduler_output",
    "sim.engine.waiting_queue",
    "sim.engine.scheduler_base",
    "sim.engine.scheduler_v1",
    "sim.engine.scheduler_v0",
    "sim.engine.core",
    "sim.request_store",
    "sim.run_loop",
    "sim.runner",
    "sim.engine.decode_columns",
    "sim.engine.prefix_pool",
    "sim.latency._base",
    "sim.latency._roofline",
    "sim.fleet._loop",
)
#: Set (to anything but "" or "0") to run the interpreted sources; at build time, to build none.
ENV = "KVTUNE_PURE_PYTHON"
#: Written by setup.py beside this file: the sha256 of each compiled source when it was built.
STAMP = "_compiled_build.json"

_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds sim/
_state = "interpreted"


def source_path(name: str, root: Path = _ROOT) -> Path:
    return root.joinpath(*name.split(".")).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_path(name: str, root: Path = _ROOT) -> Path | None:
    """The built extension of module ``name``, if there is one."""
    base = source_path(name, root).with_suffix("")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.exists():
            return path
    return None


def pure_python_requested(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    return environ.get(ENV, "") not in ("", "0")


def stale_sources(root: Path = _ROOT) -> list[str]:
    """Compiled modules whose source differs from the one built (all of them without a readable stamp)."""
    try:
        built = json.loads((root / "sim" / STAMP).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return list(COMPILED)
    stale = []
    for name in COMPILED:
        path = source_path(name, root)
        if built.get(name) != (source_hash(path) if path.exists() else None):
            stale.append(name)
    return stale


class _SourceFinder:
    """Finds the compiled modules' sources, ahead of their extensions."""

    def __init__(self, names: tuple[str, ...], root: Path) -> None:
        self.names, self.root = frozenset(names), root

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002 - the meta path finder protocol
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname, self.root))


def install(root: Path = _ROOT) -> str:
    """Decide, once per process before the engine is imported, whether the compiled engine runs; returns and
    records the state: ``compiled``, ``interpreted`` (nothing built, or ``KVTUNE_PURE_PYTHON``) or ``stale``."""
    global _state
    built = [name for name in COMPILED if extension_path(name, root) is not None]
    if not built:
        _state = "interpreted"
        return _state
    stale = [] if pure_python_requested() else stale_sources(root)
    if len(built) < len(COMPILED) and not stale:
        stale = [name for name in COMPILED if name not in built]
    if pure_python_requested() or stale:
        sys.meta_path.insert(0, _SourceFinder(COMPILED, root))
        _state = "stale" if stale else "interpreted"
        if stale:
            shown = ", ".join(str(source_path(name, root).relative_to(root)) for name in stale[:3])
            more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
            warnings.warn(f"kvtune: {shown}{more} changed since the compiled engine was built; running the "
                          f"interpreted engine (2-4x slower). Rebuild it with `pip install -e .` (or set "
                          f"{ENV}=1 to silence this).", RuntimeWarning, stacklevel=2)
        return _state
    _state = "compiled"
    return _state


def state() -> str:
    """``compiled``, ``interpreted`` or ``stale`` (see :func:`install`)."""
    return _state
