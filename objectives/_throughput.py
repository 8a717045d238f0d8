"""Rates over the makespan: output tokens per second and goodput (requests per second within SLO).

Makespan = last ``end_s`` of any request minus first ``arrival_s`` of any request: the span over which the
service was loaded, so a config that drains the queue late pays for it in every rate.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from objectives._censor import latency_samples
from objectives._tables import FINISHED, check_requests, column
from sim.workload.classes import RequestClass

NAN = float("nan")


def makespan_s(requests: pd.DataFrame) -> float:
    """Last known ``end_s`` minus first ``arrival_s``; NaN when no request has an end or the span is not > 0."""
    span = column(requests, "end_s").max() - column(requests, "arrival_s").min()
    return float(span) if span > 0 else NAN


def finished_output_tokens(requests: pd.DataFrame) -> float:
    """New output tokens of finished requests (NaN if any of them is unknown)."""
    finished = requests["status"].astype(str).eq(FINISHED)
    return float(column(requests, "generated_tokens")[finished].sum(skipna=False))


def slo_met(requests: pd.DataFrame, samples: pd.DataFrame, classes: Mapping[str, RequestClass]) -> pd.Series:
    """Per request: 1.0 if it finished with every target of its class met (each p99 target used as a per-request
    threshold), 0.0 if not, NaN if a value needed to judge is unknown.  A TPOT target does not apply to a
    finished 1-token answer."""
    finished = requests["status"].astype(str).eq(FINISHED)
    failed = ~finished
    unknown = pd.Series(False, index=requests.index)
    names = requests["class"].astype(str)
    for name, cls in classes.items():
        rows = names.eq(name) & finished
        for metric, target in cls.slo.targets().items():
            value = samples[metric].where(rows)
            if metric == "tpot_s":
                value = value.where(samples["tpot_applicable"], -np.inf)  # not applicable: passes
            failed |= rows & value.gt(target)
            unknown |= rows & value.isna()
    return pd.Series(np.where(failed, 0.0, np.where(unknown, np.nan, 1.0)), index=requests.index)


def output_tokens_per_s(requests: pd.DataFrame) -> float:
    """New output tokens of finished requests per second of makespan."""
    check_requests(requests)
    return finished_output_tokens(requests) / makespan_s(requests)


def goodput_rps(requests: pd.DataFrame, classes: Mapping[str, RequestClass]) -> float:
    """Requests per second of makespan that finished within all their class's SLOs."""
    samples = latency_samples(requests, classes)
    return float(slo_met(requests, samples, classes).sum(skipna=False)) / makespan_s(requests)
