"""Rates over the makespan: output tokens per second and goodput (requests per second within SLO).

Makespan = last ``end_s`` of any request minus first ``arrival_s`` of any request: the span over which the
service was loaded, so a config that drains the queue late pays for it in every rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from objectives._censor import LATENCY_METRICS, latency_samples, nanmax, nanmin
from objectives._tables import FINISHED, check_requests, label_mask, labels, values
from sim.workload.classes import RequestClass

NAN = float("nan")


def makespan_s(requests: pd.DataFrame) -> float:
    """Last known ``end_s`` minus first ``arrival_s``; NaN when no request has an end or the span is not > 0."""
    return span_s(values(requests, "end_s"), values(requests, "arrival_s"))


def span_s(end: np.ndarray, arrival: np.ndarray) -> float:
    """:func:`makespan_s` of the ``end_s`` and ``arrival_s`` arrays."""
    span = nanmax(end) - nanmin(arrival)
    return float(span) if span > 0 else NAN


def finished_output_tokens(requests: pd.DataFrame) -> float:
    """New output tokens of finished requests (NaN if any of them is unknown)."""
    finished = requests["status"].astype(str).eq(FINISHED).to_numpy()
    return float(values(requests, "generated_tokens")[finished].sum())


def slo_checks(requests: pd.DataFrame, samples: pd.DataFrame, classes: Mapping[str, RequestClass]) -> pd.DataFrame:
    """Per request and SLO metric (``ttft_s``, ``tpot_s``, ``e2e_s`` columns): 1.0 if the request met its class's
    target for it (the p99 target used as a per-request threshold), 0.0 if it missed it, NaN if its class has no
    such target or a value needed to judge is unknown.  A request that did not finish (timed out, cancelled,
    rejected, unfinished) misses every target of its class; a TPOT target does not apply to a finished 1-token
    answer (met).  Column ``met``: 1.0 when every target of the class is met (also for a class without
    targets, if finished), 0.0 if one is missed, NaN if unknown."""
    finished = requests["status"].astype(str).eq(FINISHED).to_numpy()
    codes, names = labels(requests, "class")
    arrays = {c: samples[c].to_numpy() for c in (*LATENCY_METRICS, "tpot_applicable")}
    checks = judge(finished, lambda name: label_mask(codes, names, (name,)), arrays, classes)
    return pd.DataFrame(checks, index=requests.index)


def judge(finished: np.ndarray, class_rows: Callable[[str], np.ndarray], samples: Mapping[str, np.ndarray],
          classes: Mapping[str, RequestClass]) -> dict[str, np.ndarray]:
    """:func:`slo_checks` on arrays: ``finished`` and ``class_rows(name)`` boolean row masks, ``samples`` the
    ``latency_samples`` columns, all in row order."""
    out: dict[str, np.ndarray] = {}
    failed = ~finished
    unknown = np.zeros(len(finished), dtype=bool)
    for metric in LATENCY_METRICS:
        col = np.full(len(finished), np.nan)
        value = samples[metric]
        if metric == "tpot_s":  # not applicable: passes
            value = np.where(samples["tpot_applicable"].astype(bool) | ~finished, value, -np.inf)
        for name, cls in classes.items():
            target = cls.slo.targets().get(metric)
            if target is None:
                continue
            rows = class_rows(name)
            missed = value > target
            judged = np.where(np.isnan(value), np.nan, np.where(missed, 0.0, 1.0))
            col = np.where(rows, np.where(finished, judged, 0.0), col)
            failed |= rows & finished & missed
            unknown |= rows & finished & np.isnan(value)
        out[metric] = col
    out["met"] = np.where(failed, 0.0, np.where(unknown, np.nan, 1.0))
    return out


def slo_met(requests: pd.DataFrame, samples: pd.DataFrame, classes: Mapping[str, RequestClass]) -> pd.Series:
    """Per request: ``met`` of :func:`slo_checks` (all targets of its class met)."""
    return slo_checks(requests, samples, classes)["met"]


def output_tokens_per_s(requests: pd.DataFrame) -> float:
    """New output tokens of finished requests per second of makespan."""
    check_requests(requests)
    return finished_output_tokens(requests) / makespan_s(requests)


def goodput_rps(requests: pd.DataFrame, classes: Mapping[str, RequestClass]) -> float:
    """Requests per second of makespan that finished within all their class's SLOs."""
    samples = latency_samples(requests, classes)
    return float(slo_met(requests, samples, classes).sum(skipna=False)) / makespan_s(requests)
