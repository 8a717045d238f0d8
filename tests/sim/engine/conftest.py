"""Shared fixtures for engine tests: tiny workloads and a simulation with an inspectable engine."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.engine.config import EngineConfig
from sim.latency import LinearStepModel
from sim.profiles import load_gpu, load_model
from sim.runner import Simulation
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload


def make_workload(rows, classes: dict[str, RequestClass] | None = None) -> Workload:
    """rows: (arrival_s, prompt_tokens, output_tokens[, class]) tuples."""
    records = []
    for i, row in enumerate(rows):
        arrival, prompt, output = row[:3]
        name = row[3] if len(row) > 3 else "default"
        records.append({"request_id": i, "class": name, "arrival_s": float(arrival), "prompt_tokens": int(prompt), "output_tokens": int(output)})
    df = pd.DataFrame.from_records(records, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    classes = classes or {"default": RequestClass("default")}
    return Workload(requests=df, classes=classes)


def make_sim(workload: Workload, step_s: float = 0.01, per_token_s: float = 0.0, **knobs) -> Simulation:
    """A simulation on Llama-3-8B/H100 geometry with a linear step-time model (decisions, not speed)."""
    config = EngineConfig(**knobs)
    return Simulation(
        workload, config, load_model("Llama-3-8B"), load_gpu("H100-SXM"),
        latency=LinearStepModel(step_s, per_token_s),
    )


@pytest.fixture
def workload_factory():
    return make_workload


@pytest.fixture
def sim_factory():
    return make_sim
