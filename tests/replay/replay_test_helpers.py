"""Helpers shared by the replay tests (a module with a unique name, importable from the test files)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pandas as pd

from replay.launcher import EngineProcess, free_port, twin_command
from sim.engine.config import EngineConfig
from sim.workload import Workload
from sim.workload.classes import RequestClass

MODEL = "Llama-3-8B"
GPU = "A100-80GB"


@contextlib.contextmanager
def running_twin(knobs: dict | None = None, *, speed: float = 20.0, slack_ms: float = 50.0,
                 coefficients: dict | None = None, tmp_path=None,
                 served_model_name: str | None = None) -> Iterator[str]:
    """A twin subprocess on a free localhost port; yields its base URL, stops it (process group) on exit.
    ``served_model_name``: the model id it serves (default MODEL)."""
    config = EngineConfig.from_dict(knobs or {})
    port = free_port()
    argv, env = twin_command(config, MODEL, GPU, port=port, speed=speed, slack_ms=slack_ms, coefficients=coefficients,
                             served_model_name=served_model_name)
    log_path = (tmp_path / f"twin-{port}.log") if tmp_path is not None else None
    proc = EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=log_path, startup_timeout_s=60,
                         stop_timeout_s=10)
    with proc:
        yield proc.base_url
    assert proc.returncode == 0, proc.log_tail()


def make_workload(rows: list[tuple[str, float, int, int]], classes: dict[str, RequestClass]) -> Workload:
    """``rows``: (class, arrival_s, prompt_tokens, output_tokens), request ids in order."""
    df = pd.DataFrame(rows, columns=["class", "arrival_s", "prompt_tokens", "output_tokens"])
    df.insert(0, "request_id", range(len(df)))
    return Workload(df.sort_values("arrival_s", kind="stable").reset_index(drop=True), classes, source="test")


def replay_lag_s(result, worst: bool = False) -> float:
    """What this machine's load did to a wall-clock replay, as measured by the replay itself (trace seconds):
    the client's send lag (p99, or with ``worst`` its largest, for a bound on every request; once going out, once
    for the answer read late), the twin's engine-clock lag (its largest, from its /metrics) and how late the client
    closed streams after their deadlines (its largest).  Milliseconds x SPEED on a quiet machine; seconds under CPU
    contention."""
    twin = result.metrics_after.get("twin_max_lag_s", 0.0)
    send = result.info["send_lag_max_s" if worst else "send_lag_p99_s"]
    return 2 * send + (twin if twin == twin else 0.0) + result.info.get("close_lag_max_s", 0.0)
