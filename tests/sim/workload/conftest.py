"""Shared paths: the small samples beside the tests, and the real traces in the shared folder (may be absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
SHARED_TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces"


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not present at {SHARED_TRACES}")
    return SHARED_TRACES


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path
