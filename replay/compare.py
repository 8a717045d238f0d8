"""What the engine itself says about a run, on the same columns for a measured replay and a simulation.

A client sees latencies and tokens; only the server's ``/metrics`` tells preemptions per request, prefix-cache
hits, why requests waited and the KV cache it runs with.  :func:`measured_engine_view` reads those from a replay
(counter deltas between the scrapes before and after the run, gauges' peaks over the samples, vLLM's
``cache_config_info``); :func:`simulated_engine_view` computes the same columns from a simulation's tables, so
that the two line up (e.g. in calibration and the fidelity benchmark).

Columns: ``preemptions_total``; ``requests_finished``; ``request_num_preemptions_le_<b>`` (finished requests
with at most ``b`` preemptions, at vLLM's bucket bounds 1, 2, 3, 4, 5, 10, 20, inf: vllm 0.32
``vllm:request_num_preemptions``); ``prompt_tokens`` and ``generation_tokens`` (vLLM counts a prompt once, never
its recomputation); ``prefix_cache_hit_tokens``; ``waiting_capacity_peak`` (most requests waiting for capacity
at a sample; a simulation's step rows are its samples); ``kv_cache_usage_peak``; ``num_gpu_blocks``;
``block_size``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from replay.results import ReplayResult
from replay.twin_metrics import PREEMPTION_BUCKETS

NAN = math.nan
#: The columns both views have, in order.
ENGINE_VIEW_COLUMNS = (
    "preemptions_total", "requests_finished",
    *(f"request_num_preemptions_le_{b}" for b in PREEMPTION_BUCKETS), "request_num_preemptions_le_inf",
    "prompt_tokens", "generation_tokens", "prefix_cache_hit_tokens", "waiting_capacity_peak",
    "kv_cache_usage_peak", "num_gpu_blocks", "block_size",
)


def _peak(frame: pd.DataFrame, column: str) -> float:
    if column not in frame or not len(frame):
        return NAN
    values = frame[column].to_numpy(dtype=float)
    return float(np.nanmax(values)) if not np.isnan(values).all() else NAN


def measured_engine_view(result: ReplayResult) -> dict[str, float]:
    """The engine's own account of a replay (NaN for what the server did not export)."""
    d = result.counter_delta
    hist = {float(k): v for k, v in (result.info.get("request_num_preemptions_hist") or {}).items()}
    out: dict[str, float] = {
        "preemptions_total": d("num_preemptions_total"),
        "requests_finished": hist.get(math.inf, NAN),
    }
    for b in PREEMPTION_BUCKETS:
        out[f"request_num_preemptions_le_{b}"] = hist.get(float(b), NAN)
    out["request_num_preemptions_le_inf"] = hist.get(math.inf, NAN)
    out["prompt_tokens"] = d("prompt_tokens_total")
    out["generation_tokens"] = d("generation_tokens_total")
    out["prefix_cache_hit_tokens"] = d("prefix_cache_hits_total")
    out["waiting_capacity_peak"] = _peak(result.samples, "num_requests_waiting_capacity")
    out["kv_cache_usage_peak"] = _peak(result.samples, "kv_cache_usage_perc")
    after = result.metrics_after
    out["num_gpu_blocks"] = float(after.get("num_gpu_blocks", NAN))
    out["block_size"] = float(after.get("block_size", NAN))
    return out


def simulated_engine_view(requests: pd.DataFrame, steps: pd.DataFrame | None, num_gpu_blocks: float,
                          block_size: float) -> dict[str, float]:
    """The same columns from a simulation's request and step tables (``steps`` may be None: peaks NaN)."""
    finished = requests[requests["status"] == "finished"]
    preempt = finished["num_preemptions"].to_numpy(dtype=float)
    started = requests["first_token_s"].notna()
    out: dict[str, float] = {
        "preemptions_total": float(requests["num_preemptions"].sum()),
        "requests_finished": float(len(finished)),
    }
    for b in PREEMPTION_BUCKETS:
        out[f"request_num_preemptions_le_{b}"] = float((preempt <= b).sum())
    out["request_num_preemptions_le_inf"] = float(len(finished))
    out["prompt_tokens"] = float(requests.loc[started, "prompt_tokens"].sum())
    out["generation_tokens"] = float(requests["generated_tokens"].sum())
    out["prefix_cache_hit_tokens"] = float(requests["prefix_hit_tokens"].sum())
    if steps is not None and len(steps):
        out["waiting_capacity_peak"] = _peak(steps, "num_waiting")
        usage = steps["kv_blocks_used"].to_numpy(dtype=float) / steps["kv_blocks_total"].to_numpy(dtype=float)
        out["kv_cache_usage_peak"] = float(np.nanmax(usage)) if len(usage) else NAN
    else:
        out["waiting_capacity_peak"] = out["kv_cache_usage_peak"] = NAN
    out["num_gpu_blocks"] = float(num_gpu_blocks)
    out["block_size"] = float(block_size)
    return out


def compare_engine_views(measured: dict[str, Any], simulated: dict[str, Any]) -> pd.DataFrame:
    """One row per column: measured, simulated and their difference."""
    rows = [{"column": c, "measured": measured.get(c, NAN), "simulated": simulated.get(c, NAN)}
            for c in ENGINE_VIEW_COLUMNS]
    frame = pd.DataFrame(rows)
    frame["difference"] = frame["simulated"] - frame["measured"]
    return frame


__all__ = ["ENGINE_VIEW_COLUMNS", "compare_engine_views", "measured_engine_view", "simulated_engine_view"]
