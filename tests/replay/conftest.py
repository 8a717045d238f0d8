"""Fixtures for the replay tests: a shared twin on a free localhost port and the bundled trace."""

from __future__ import annotations

from typing import Iterator

import pytest

from replay_test_helpers import running_twin
from sim.workload import Workload, bundled_trace_path, load_trace


@pytest.fixture(scope="session")
def shared_twin(tmp_path_factory) -> Iterator[str]:
    """One twin for the API and metrics tests: default V1 config, max_model_len 4096, speed 20."""
    with running_twin({"max_model_len": 4096}, speed=20.0, tmp_path=tmp_path_factory.mktemp("twin")) as url:
        yield url


@pytest.fixture(scope="session")
def conv_trace() -> Workload:
    return load_trace(bundled_trace_path())
