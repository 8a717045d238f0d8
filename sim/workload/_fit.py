"""Fitting synthetic traffic to a trace, and describing a trace: the numbers that decide KV-cache pressure.

Per class: request rate, inter-arrival CV (burstiness), and lognormal lengths through the median and p99.
A generator run from the fit for the trace's duration reproduces its rate and its length medians and tails.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from sim.workload._arrivals import interarrival_cv
from sim.workload._generator import ClassTraffic, GeneratorSpec
from sim.workload._lengths import Empirical, fit_lognormal
from sim.workload.workload import Workload


def _span(workload: Workload) -> float:
    return workload.span_s


def fit_workload(workload: Workload, *, empirical_from: Empirical | None = None) -> GeneratorSpec:
    """A generator with one class per workload class, run for the workload's span.

    A class's CV is that of its own inter-arrival gaps (NaN with under 3 requests: taken as Poisson, 1.0).
    Lengths are lognormal through each class's p50 and p99, which keeps the tail but not the mean (Azure conv:
    output mean 160 vs 211); ``empirical_from`` (the trace the workload came from) resamples each class's own
    (prompt, output) pairs instead, keeping means and the prompt/output correlation.
    """
    span = _span(workload)
    if len(workload) < 2 or span <= 0:
        raise ValueError(f"{workload.source}: need at least 2 requests over a positive time span to fit a rate")
    df = workload.requests
    traffic = []
    for name, rows in df.groupby("class", sort=True):
        arrivals = rows["arrival_s"].to_numpy()
        cv = interarrival_cv(arrivals)
        rate = len(rows) / span
        cv = round(float(cv), 4) if np.isfinite(cv) and cv > 0 else 1.0
        if empirical_from is not None:
            lengths = replace(empirical_from, trace_class=str(name))
            traffic.append(ClassTraffic(str(name), rate, cv, lengths=lengths))
        else:
            traffic.append(ClassTraffic(str(name), rate, cv, fit_lognormal(rows["prompt_tokens"].to_numpy()),
                                        fit_lognormal(rows["output_tokens"].to_numpy())))
    return GeneratorSpec(tuple(traffic), duration_s=span)


_QUANTILES = (50, 90, 99)


def _describe_rows(name: str, rows: pd.DataFrame, span: float) -> dict[str, object]:
    out: dict[str, object] = {"class": name, "requests": len(rows), "span_s": span,
                              "rate_rps": len(rows) / span if span > 0 else float("nan"),
                              "interarrival_cv": interarrival_cv(rows["arrival_s"].to_numpy())}
    for column, short in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        values = rows[column].to_numpy()
        out[f"{short}_mean"] = float(values.mean())
        for q, v in zip(_QUANTILES, np.percentile(values, _QUANTILES)):
            out[f"{short}_p{q}"] = float(v)
    return out


def describe(workload: Workload) -> pd.DataFrame:
    """One row per class plus ``all``: count, span, rate, inter-arrival CV, mean and p50/p90/p99 lengths."""
    df = workload.requests
    span = _span(workload)
    rows = [_describe_rows(str(name), part, span) for name, part in df.groupby("class", sort=True)]
    if len(rows) != 1:
        rows.append(_describe_rows("all", df, span))
    return pd.DataFrame(rows)
