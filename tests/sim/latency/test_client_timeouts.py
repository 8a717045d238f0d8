"""A client timeout counts the client-side latency (issue 32): ``kvtune simulate --profile`` and the real-engine
benchmark add the profile's measured client latency to every simulated token (``add_client_latency``), so the engine
must be simulated with each timeout shortened by it (``with_client_timeouts``).  Otherwise a request the simulator
finishes just inside its timeout is reported as finished, later than the timeout, which no client sees (the
at-scale benchmark predicted a 10.30 s p99 E2E for a 10 s timeout)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.engine import EngineConfig
from sim.latency import add_client_latency, with_client_timeouts
from sim.latency._profile_file import MIN_CLIENT_TIMEOUT_S
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
from sim.workload import RequestClass, Workload

TIMEOUT_S, OFFSET_S = 2.0, 0.3


def _workload() -> Workload:
    rng = np.random.default_rng(7)
    n = 80
    df = pd.DataFrame({"request_id": range(n), "class": ["chat"] * n,
                       "arrival_s": np.cumsum(rng.exponential(0.1, n)), "prompt_tokens": rng.integers(64, 512, n),
                       "output_tokens": rng.integers(16, 400, n)})
    return Workload(df, {"chat": RequestClass("chat", timeout_s=TIMEOUT_S), "none": RequestClass("none")},
                    source="test")


def test_the_timeouts_are_shortened_by_the_offset():
    w = _workload()
    short = with_client_timeouts(w, OFFSET_S)
    assert short.classes["chat"].timeout_s == TIMEOUT_S - OFFSET_S and short.classes["none"].timeout_s is None
    assert w.classes["chat"].timeout_s == TIMEOUT_S  # the workload given is left as it was
    assert with_client_timeouts(w, 0.0) is w
    assert with_client_timeouts(w, 5.0).classes["chat"].timeout_s == MIN_CLIENT_TIMEOUT_S


def _client_view(workload: Workload) -> tuple[pd.DataFrame, float]:
    sim = simulate(workload, EngineConfig(max_num_seqs=8, max_num_batched_tokens=256), load_model("Llama-3-8B"), load_gpu("L40S"), seed=0)
    steps = sim.steps  # a row may stand for several equal steps (num_steps)
    return add_client_latency(sim.requests, OFFSET_S), float((steps["duration_s"] / steps["num_steps"]).max())


def test_no_finished_request_is_later_than_its_clients_timeout():
    w = _workload()
    late, step = _client_view(w)
    done = late[late["status"] == "finished"]
    # Without the shortening: requests finish inside the engine's 2 s and reach the client up to 0.3 s after it.
    assert (done["e2e_s"] > TIMEOUT_S + 2 * step).any(), (done["e2e_s"].max(), step)
    fixed, step = _client_view(with_client_timeouts(w, OFFSET_S))
    done = fixed[fixed["status"] == "finished"]
    assert len(done) and (fixed["status"] == "timed_out").any()
    # A deadline that passes during a step ends the request after that step (the engine aborts between steps, as
    # vLLM does), so a request can finish within one step after it; no later.
    assert (done["e2e_s"] <= TIMEOUT_S + step + 1e-9).all(), (done["e2e_s"].max(), step)
