"""Builders of small request and step tables (docs/design.md, 'Data contracts') for the objectives tests."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from sim.latency import PART_NAMES

NAN = math.nan


def request(status: str = "finished", *, cls: str = "default", arrival: float = 0.0, ttft: float = NAN,
            end: float = NAN, generated: int = 10, prompt: int = 100, preemptions: int = 0,
            recomputed: int = 0, tpot: float | None = None) -> dict:
    """One request row; times relative to ``arrival``.  A finished request gets ``e2e = end`` and
    ``tpot = (end - ttft) / (generated - 1)`` unless given."""
    first = arrival + ttft if not math.isnan(ttft) else NAN
    end_s = arrival + end if not math.isnan(end) else NAN
    finished = status == "finished"
    if tpot is None:
        tpot = (end - ttft) / (generated - 1) if finished and generated >= 2 else NAN
    return {
        "class": cls, "arrival_s": arrival, "prompt_tokens": prompt, "output_tokens_target": max(generated, 1),
        "generated_tokens": generated, "status": status, "first_scheduled_s": arrival, "first_token_s": first,
        "end_s": end_s, "ttft_s": ttft, "e2e_s": end if finished else NAN, "tpot_s": tpot,
        "queue_wait_s": 0.0, "resume_wait_s": 0.0, "num_preemptions": preemptions,
        "recomputed_tokens": recomputed, "swapped_out_blocks": 0, "swapped_in_blocks": 0,
        "kv_blocks_peak": 1, "prefix_hit_tokens": 0,
    }


def requests(*rows: dict) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    df.insert(0, "request_id", range(len(df)))
    return df


def step(*, duration: float = 0.01, new: int = 0, recompute: int = 0, decode: int = 0, num_steps: int = 1,
         used: int = 10, total: int = 100, start: float = 0.0, swap_out: int = 0, swap_in: int = 0,
         parts: dict | None = None) -> dict:
    """One step row; ``parts`` (``{"recompute": 0.2, ...}``, seconds) adds the ``time_*_s`` columns (missing
    parts 0); without it the row has none, as a replay's timeline."""
    times = {} if parts is None else {f"time_{p}_s": float(parts.get(p, 0.0)) for p in PART_NAMES}
    return {**times, 
        "step": 0, "num_steps": num_steps, "start_s": start, "duration_s": duration, "num_running": 1,
        "num_waiting": 0, "num_swapped": 0, "prefill_tokens_new": new, "prefill_tokens_recompute": recompute,
        "decode_tokens": decode, "kv_blocks_used": used, "kv_blocks_total": total, "swap_out_blocks": swap_out,
        "swap_in_blocks": swap_in, "preempted": 0,
    }


def steps(*rows: dict) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    df["step"] = range(len(df))
    return df


@pytest.fixture(scope="session")
def tables() -> SimpleNamespace:
    """``tables.request(...)``, ``tables.requests(*rows)``, ``tables.step(...)``, ``tables.steps(*rows)``."""
    return SimpleNamespace(request=request, requests=requests, step=step, steps=steps)
