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

import numpy as np
import pandas as pd

from objectives._steps import StepTotals
from objectives._tables import CANCELLED, FINISHED, REJECTED, TIMED_OUT, UNFINISHED, check_requests, column
from sim.errors import ConfigError
from sim.workload.classes import RequestClass

LATENCY_METRICS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s")


def observation_end(requests: pd.DataFrame, steps: "pd.DataFrame | StepTotals | None" = None) -> float:
    """The last instant either table mentions (request ends, step ends); NaN when neither has one.  ``steps`` may
    be the :class:`~objectives.StepTotals` a run accumulated instead of its step table."""
    ends = [column(requests, "end_s").max(), column(requests, "arrival_s").max()]
    if isinstance(steps, StepTotals):
        ends.append(steps.end_s)
    elif steps is not None and len(steps) and {"start_s", "duration_s"} <= set(steps.columns):
        ends.append((column(steps, "start_s") + column(steps, "duration_s")).max())
    ends = [e for e in ends if pd.notna(e)]
    return float(max(ends)) if ends else float("nan")


def class_timeouts(requests: pd.DataFrame, classes: Mapping[str, RequestClass]) -> pd.Series:
    """Each request's class timeout (NaN: none); a request of an undefined class is a ``ConfigError``."""
    names = requests["class"].astype(str)
    unknown = sorted(set(names) - set(classes))
    if unknown:
        raise ConfigError("requests.class", f"classes with no definition: {unknown}; defined: {sorted(classes)}")
    timeout = {n: (c.timeout_s if c.timeout_s is not None else np.nan) for n, c in classes.items()}
    return names.map(timeout).astype("float64")


def censored_value(requests: pd.DataFrame, timeouts: pd.Series, obs_end: float) -> pd.Series:
    """The censored value of every request by the rule in the module docstring (used where not produced)."""
    status = requests["status"].astype(str)
    end = column(requests, "end_s").fillna(obs_end)
    waited = end - column(requests, "arrival_s")
    at_least_timeout = np.fmax(waited, timeouts)  # fmax ignores a NaN side
    value = pd.Series(np.inf, index=requests.index)
    value = value.mask(status.isin([CANCELLED, UNFINISHED]), waited.fillna(timeouts))
    value = value.mask(status.isin([TIMED_OUT, REJECTED]), at_least_timeout)
    value = value.mask(status.eq(REJECTED) & timeouts.isna(), np.inf)
    return value.fillna(np.inf).mask(status.eq(FINISHED), np.nan)


def latency_samples(
    requests: pd.DataFrame, classes: Mapping[str, RequestClass], steps: "pd.DataFrame | StepTotals | None" = None
) -> pd.DataFrame:
    """One row per request (same index): ``ttft_s``, ``tpot_s``, ``e2e_s`` with censoring applied,
    ``tpot_applicable`` (False for requests without a second token) and the ``ttft_censored``/``e2e_censored``
    flags.  NaN means unknown."""
    check_requests(requests)
    finished = requests["status"].astype(str).eq(FINISHED)
    arrival = column(requests, "arrival_s")
    first = column(requests, "first_token_s")
    end = column(requests, "end_s")
    generated = column(requests, "generated_tokens")
    censored = censored_value(requests, class_timeouts(requests, classes), observation_end(requests, steps))

    ttft = column(requests, "ttft_s").fillna(first - arrival)
    ttft_censored = ~(finished | ttft.notna() | generated.ge(1))
    ttft = ttft.mask(ttft_censored, censored)

    e2e = column(requests, "e2e_s").where(finished, censored)

    tpot = column(requests, "tpot_s").fillna(((end - first) / (generated - 1)).where(~finished & generated.ge(2)))
    no_second = generated.lt(2) | (~finished & generated.isna() & tpot.isna())
    tpot = tpot.mask(no_second, np.nan)
    return pd.DataFrame(
        {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "tpot_applicable": ~no_second,
         "ttft_censored": ttft_censored, "e2e_censored": ~finished},
        index=requests.index,
    )
