"""Trace paths in specs: relative to the spec file's folder, and ``bundled`` for the trace shipped with kvtune."""

from __future__ import annotations

from pathlib import Path

BUNDLED = "bundled"


def resolve_trace_path(trace: str, base_dir: Path | None) -> Path:
    if trace == BUNDLED:
        from sim.workload._loader import bundled_trace_path

        return bundled_trace_path()
    path = Path(trace).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path
