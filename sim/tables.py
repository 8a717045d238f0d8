"""The request table and the step table of DESIGN section 3, built from the engine's final state."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.engine.core import STEP_COLUMNS
from sim.engine.request import Request

#: A request's share of the steps' time parts (transfer is not attributed per request: see its swapped blocks).
REQUEST_TIME_COLUMNS = ("time_prefill_new_s", "time_recompute_s", "time_decode_s", "time_overhead_s")
REQUEST_COLUMNS = (
    "request_id", "class", "arrival_s", "prompt_tokens", "output_tokens_target", "generated_tokens", "status",
    "first_scheduled_s", "first_token_s", "end_s", "ttft_s", "e2e_s", "tpot_s", "queue_wait_s", "resume_wait_s",
    "num_preemptions", "recomputed_tokens", "swapped_out_blocks", "swapped_in_blocks", "kv_blocks_peak",
    "prefix_hit_tokens", "max_itl_s", "preempted_s",
) + REQUEST_TIME_COLUMNS


def request_table(requests: list[Request]) -> pd.DataFrame:
    """One row per request of the workload, in arrival order, whatever its status."""
    arrival = np.array([r.arrival_s for r in requests], dtype=float)
    first_sched = np.array([r.first_scheduled_s for r in requests], dtype=float)
    first_token = np.array([r.first_token_s for r in requests], dtype=float)
    end = np.array([r.end_s for r in requests], dtype=float)
    generated = np.array([r.num_output_tokens for r in requests], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(generated > 1, (end - first_token) / (generated - 1), np.nan)
    return pd.DataFrame({
        "request_id": np.array([r.request_id for r in requests], dtype=np.int64),
        "class": [r.class_name for r in requests],
        "arrival_s": arrival,
        "prompt_tokens": np.array([r.prompt_tokens for r in requests], dtype=np.int64),
        "output_tokens_target": np.array([r.output_tokens_target for r in requests], dtype=np.int64),
        "generated_tokens": generated,
        "status": [r.status.value for r in requests],
        # Finished at max_model_len before its output target (vLLM's finish reason "length"): capped, not complete.
        "capped": np.array([r.status.value == "finished" and r.num_output_tokens < r.output_tokens_target
                            for r in requests], dtype=bool),
        "first_scheduled_s": first_sched,
        "first_token_s": first_token,
        "end_s": end,
        "ttft_s": first_token - arrival,
        "e2e_s": end - arrival,
        "tpot_s": tpot,
        "queue_wait_s": first_sched - arrival,
        "resume_wait_s": np.array([r.resume_wait_s for r in requests], dtype=float),
        "num_preemptions": np.array([r.num_preemptions for r in requests], dtype=np.int64),
        "recomputed_tokens": np.array([r.recomputed_tokens for r in requests], dtype=np.int64),
        "swapped_out_blocks": np.array([r.swapped_out_blocks for r in requests], dtype=np.int64),
        "swapped_in_blocks": np.array([r.swapped_in_blocks for r in requests], dtype=np.int64),
        "kv_blocks_peak": np.array([r.kv_blocks_peak for r in requests], dtype=np.int64),
        "prefix_hit_tokens": np.array([r.prefix_hit_tokens for r in requests], dtype=np.int64),
        "max_itl_s": np.array([r.max_itl_s for r in requests], dtype=float),
        "preempted_s": np.array([r.preempted_s for r in requests], dtype=float),
        **{c: np.array([getattr(r, c) for r in requests], dtype=float) for c in REQUEST_TIME_COLUMNS},
    })


def step_table(rows: list[tuple]) -> pd.DataFrame:
    """One row per step or per run of identical decode steps (``num_steps`` > 1)."""
    df = pd.DataFrame.from_records(rows, columns=list(STEP_COLUMNS))
    int_cols = [c for c in STEP_COLUMNS if c not in ("start_s", "duration_s") and not c.startswith("time_")]
    return df.astype({c: "int64" for c in int_cols})
