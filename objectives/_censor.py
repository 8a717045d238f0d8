"""Per-request latency samples in which requests that did not finish are censored, never dropped.

Rule (applied to ``ttft_s`` and ``e2e_s``; ``tpot_s`` is never censored, see the last point):

- A metric the request produced is its observed value: ``ttft_s`` once it had a first token, ``e2e_s`` when
  ``finished``, ``tpot_s`` once it had a second token (the column, or for a request that left early
  ``(end_s - first_token_s) / (generated_tokens - 1)``).  Produced means the value is known or
  ``generated_tokens`` shows it (>= 1 for TTFT, >= 2 for TPOT); produced but unknown stays NaN.
- A TTFT or E2E it did not produce, for a request that is not ``finished``, takes a censored value, a lower bound
  on what its client saw.  Let ``waited = end_s - arrival_s`` (``end_s`` unknown: the end of observation,
  the last time either table mentions, minus ``arrival_s``) and ``T`` the class timeout:
    * ``timed_out``: ``max(waited, T)``;
    * ``cancelled``, ``unfinished``: ``waited`` (the client left, or the run stopped, that late);
    * ``rejected``: ``max(waited, T)`` if the class has a timeout, else ``+inf``: a refused request never
      gets an answer, and the instant of refusal bounds nothing (counting it as ~0 s would reward rejecting);
    * ``waited`` unknown (no end anywhere): ``T``, or ``+inf`` without a timeout.
  ``ttft_censored``/``e2e_censored`` mark the rows that took one (the summary reports their share beside
  every percentile).
- A request with no second token has no TPOT (``tpot_applicable`` False; excluded from TPOT percentiles): a
  finished 1-token answer, and a request lost before its second token, whose time is in its E2E and TTFT
  censoring, not in a per-token figure (filling it with its whole wait made one lost request read as a
  "p99 TPOT of 120 s").
- A ``finished`` request whose ``ttft_s``/``e2e_s`` is unknown (NaN, as replay tables leave unobservable
  columns) makes the cohort's percentile NaN rather than invent a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._requests import RequestArrays
from objectives._steps import StepTotals
from objectives._tables import CANCELLED, FINISHED, REJECTED, TIMED_OUT, UNFINISHED, column, values
from sim.errors import ConfigError
from sim.workload.classes import RequestClass

LATENCY_METRICS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s")


def observation_end(requests: pd.DataFrame, steps: "pd.DataFrame | StepTotals | None" = None) -> float:
    """The last instant either table mentions (request ends, step ends); NaN when neither has one.  ``steps`` may
    be the :class:`~objectives.StepTotals` a run accumulated instead of its step table."""
    return last_instant(values(requests, "end_s"), values(requests, "arrival_s"), steps)


def last_instant(end: np.ndarray, arrival: np.ndarray, steps: "pd.DataFrame | StepTotals | None") -> float:
    """:func:`observation_end` from the request table's ``end_s`` and ``arrival_s`` arrays."""
    ends = [nanmax(end), nanmax(arrival)]
    if isinstance(steps, StepTotals):
        ends.append(steps.end_s)
    elif steps is not None and len(steps) and {"start_s", "duration_s"} <= set(steps.columns):
        ends.append((column(steps, "start_s") + column(steps, "duration_s")).max())
    ends = [e for e in ends if pd.notna(e)]
    return float(max(ends)) if ends else float("nan")


def nanmax(a: np.ndarray) -> float:
    """The largest known value (pandas' ``max``: NaN skipped; NaN when none is known)."""
    known = a[~np.isnan(a)]
    return float(known.max()) if known.size else float("nan")


def nanmin(a: np.ndarray) -> float:
    """The smallest known value (pandas' ``min``: NaN skipped; NaN when none is known)."""
    known = a[~np.isnan(a)]
    return float(known.min()) if known.size else float("nan")


def class_timeouts(table: RequestArrays, classes: Mapping[str, RequestClass]) -> np.ndarray:
    """Each request's class timeout (NaN: none); a request of an undefined class is a ``ConfigError``."""
    unknown = sorted(set(table.class_labels) - set(classes))
    if unknown:
        raise ConfigError("requests.class", f"classes with no definition: {unknown}; defined: {sorted(classes)}")
    timeout = [classes[n].timeout_s if classes[n].timeout_s is not None else np.nan for n in table.class_labels]
    return np.asarray(timeout, dtype="float64")[table.class_codes] if timeout else np.full(len(table), np.nan)


def censored_value(table: RequestArrays, timeouts: np.ndarray, obs_end: float) -> np.ndarray:
    """The censored value of every request by the rule in the module docstring (used where not produced)."""
    end = np.where(np.isnan(table.end), obs_end, table.end)
    waited = end - table.arrival
    at_least_timeout = np.fmax(waited, timeouts)  # fmax ignores a NaN side
    value = np.full(len(table), np.inf)
    value = np.where(table.status_is(CANCELLED, UNFINISHED), np.where(np.isnan(waited), timeouts, waited), value)
    value = np.where(table.status_is(TIMED_OUT, REJECTED), at_least_timeout, value)
    value = np.where(table.status_is(REJECTED) & np.isnan(timeouts), np.inf, value)
    value = np.where(np.isnan(value), np.inf, value)
    return np.where(table.status_is(FINISHED), np.nan, value)


@dataclass(frozen=True)
class LatencySamples:
    """The columns of :func:`latency_samples` as arrays in row order."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    tpot_applicable: np.ndarray
    ttft_censored: np.ndarray
    e2e_censored: np.ndarray

    def frame(self, index: pd.Index) -> pd.DataFrame:
        return pd.DataFrame(
            {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
             "tpot_applicable": self.tpot_applicable, "ttft_censored": self.ttft_censored,
             "e2e_censored": self.e2e_censored},
            index=index,
        )


def censor(table: RequestArrays, classes: Mapping[str, RequestClass],
           steps: "pd.DataFrame | StepTotals | None" = None) -> LatencySamples:
    """:func:`latency_samples` of the table's arrays."""
    finished = table.finished
    arrival, first, end, generated = table.arrival, table.first_token, table.end, table.generated
    censored = censored_value(table, class_timeouts(table, classes), last_instant(end, arrival, steps))

    ttft = np.where(np.isnan(table.ttft), first - arrival, table.ttft)
    ttft_censored = ~(finished | ~np.isnan(ttft) | (generated >= 1))
    ttft = np.where(ttft_censored, censored, ttft)

    e2e = np.where(finished, table.e2e, censored)

    with np.errstate(divide="ignore", invalid="ignore"):
        reached = np.where(~finished & (generated >= 2), (end - first) / (generated - 1), np.nan)
    tpot = np.where(np.isnan(table.tpot), reached, table.tpot)
    no_second = (generated < 2) | (~finished & np.isnan(generated) & np.isnan(tpot))
    tpot = np.where(no_second, np.nan, tpot)
    return LatencySamples(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, tpot_applicable=~no_second,
                          ttft_censored=ttft_censored, e2e_censored=~finished)


def latency_samples(
    requests: pd.DataFrame, classes: Mapping[str, RequestClass], steps: "pd.DataFrame | StepTotals | None" = None
) -> pd.DataFrame:
    """One row per request (same index): ``ttft_s``, ``tpot_s``, ``e2e_s`` with censoring applied,
    ``tpot_applicable`` (False for requests without a second token) and the ``ttft_censored``/``e2e_censored``
    flags.  NaN means unknown."""
    table = RequestArrays.of(requests)
    return censor(table, classes, steps).frame(table.index)
