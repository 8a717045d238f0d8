"""Fixtures of the optimizer tests: a local Ray that each module shuts down (see optimizer_test_helpers.py for
the small study they run)."""

from __future__ import annotations

from typing import Any

import pytest
from optimizer_test_helpers import spec_dict


@pytest.fixture
def base_spec() -> dict[str, Any]:
    return spec_dict()


@pytest.fixture(scope="module")
def local_ray():
    """A 2-CPU local Ray for the module; shut down at its end."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    from optimizer._executors import init_ray

    init_ray(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
