"""Transformations of a loaded workload that need more than a row slice: new arrivals, the max-model-length cap."""

from __future__ import annotations

import dataclasses

import numpy as np

from sim.errors import ConfigError
from sim.workload._arrivals import ArrivalSpec, arrival_times
from sim.workload._report import LoadReport
from sim.workload.workload import Workload


def _report(workload: Workload) -> LoadReport:
    return workload.report or LoadReport(source=workload.source, fmt="memory", rows_read=len(workload))


def replace_arrivals(workload: Workload, spec: ArrivalSpec, seed: int) -> Workload:
    """Same requests in the same order, new arrival times from ``spec`` (rate defaults to the workload's own)."""
    if spec.process == "replay":
        return workload
    arrivals = workload.requests["arrival_s"].to_numpy()
    rate = (len(arrivals) - 1) / workload.span_s if len(arrivals) > 1 and workload.span_s > 0 else None
    if spec.rate_rps is None and rate is None:
        raise ConfigError("arrival.rate_rps", "is required: the workload has no request rate of its own to keep")
    df = workload.requests.copy()
    df["arrival_s"] = arrival_times(spec, np.random.default_rng(seed), rate_rps=rate, n=len(df))
    out = workload.with_requests(df)
    rep = _report(workload)
    return dataclasses.replace(out, report=rep.with_(notes=rep.notes + (f"arrivals regenerated ({spec.process})",)))


def cap_max_model_len(workload: Workload, max_model_len: int) -> Workload:
    """Fit every request in ``max_model_len`` tokens as vLLM would see it.

    Outputs are shortened to ``max_model_len - prompt`` (the engine stops there); prompts of ``max_model_len``
    tokens or more leave no room for one output token and are rejected by vLLM's API before they reach the
    scheduler, so they are dropped. Both are counted in the report.
    """
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, (int, np.integer)) or max_model_len < 2:
        raise ConfigError("max_model_len", f"must be a whole number >= 2, got {max_model_len!r}")
    df = workload.requests
    too_long = (df["prompt_tokens"] >= max_model_len).to_numpy()
    room = max_model_len - df["prompt_tokens"].to_numpy()
    capped = ~too_long & (df["output_tokens"].to_numpy() > room)
    if not too_long.any() and not capped.any():
        return workload
    df = df.copy()
    df.loc[capped, "output_tokens"] = room[capped]
    df = df.loc[~too_long]
    rep = _report(workload)
    out = workload.with_requests(df)
    return dataclasses.replace(out, report=rep.with_(outputs_capped=rep.outputs_capped + int(capped.sum()),
                                                     prompts_too_long_dropped=rep.prompts_too_long_dropped
                                                     + int(too_long.sum())))
