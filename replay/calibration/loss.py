"""How far a simulation is from a run: per-request client timings (``run_errors``), the engine's own means
(``engine_errors``) or the engine's own steps (``step_errors``), as robust log-ratios; the client-side latency
the engine model lacks."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from replay.calibration.runs import CalibrationRun
from replay.calibration.step_log import after_idle, log_errors, prefilling, step_shapes, step_targets
from sim.engine import resolve_engine, roofline_for
from sim.latency import LatencyCoefficients, add_client_latency
from sim.runner import simulate


@dataclass(frozen=True)
class ClientLatency:
    """What a measured TTFT has that the engine model does not: ``offset_s`` for every request (HTTP, network,
    the first chunk), plus ``fanout_s`` per other request whose first token came out in the same step (the
    server and the client hand out a step's tokens one stream after another).  Nuisance parameters: fitted
    alongside the coefficients unless ``fit_client_latency=False``, reported, never exported."""

    offset_s: float = 0.0
    fanout_s: float = 0.0


#: (name, upper bound in seconds, unit of the fitted variable in seconds) of each ClientLatency field.
_CLIENT_PARAMS = (("offset_s", 1.0, 0.01), ("fanout_s", 0.01, 1e-4))


def _soft_l1(r: np.ndarray, scale: float) -> np.ndarray:
    z = (r / scale) ** 2
    return 2.0 * scale**2 * (np.sqrt(1.0 + z) - 1.0)


@dataclass
class RunErrors:
    """How far a simulation is from a run's measurements.

    ``residuals``: one per compared quantity (TTFT and TPOT of every request the run finished), the robust
    (soft-L1) log-ratio sim/measured, scaled so that ``loss = sum(residuals**2)`` is the mean robust error of
    TTFT plus that of TPOT; a request the simulation does not finish counts as a factor-2 error.
    ``ttft_log_ratio`` / ``tpot_log_ratio``: medians of the plain log-ratios.
    """

    loss: float
    ttft_log_ratio: float
    tpot_log_ratio: float
    num_compared: int
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_errors(run: CalibrationRun, coefficients: LatencyCoefficients, scale: float = 0.1,
               client: ClientLatency = ClientLatency()) -> RunErrors:
    """Simulate ``run`` with ``coefficients`` and compare per request; the simulated TTFT is compared after
    adding the client-side latency the model lacks (``client``)."""
    sim = simulate(run.workload, run.config, run.model, run.gpu, coefficients=coefficients, seed=run.seed,
                   record_steps=False).requests.copy()
    if client.offset_s or client.fanout_s:
        together = sim.groupby("first_token_s")["request_id"].transform("size").fillna(1).to_numpy(dtype=float)
        sim["ttft_s"] = sim["ttft_s"] + client.offset_s + client.fanout_s * (together - 1.0)
    meas = run.measured
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens_target", "status", "ttft_s", "tpot_s"]
    merged = meas[cols].merge(sim[["request_id", "status", "ttft_s", "tpot_s"]], on="request_id", how="left",
                              suffixes=("_m", "_s"))
    rows = merged[merged["status_m"] == "finished"]
    penalty = math.log(2.0)
    parts, medians = [], []
    num_compared = 0
    for col in ("ttft_s", "tpot_s"):
        m_all = rows[col + "_m"].to_numpy(dtype=float)
        keep = np.isfinite(m_all) & (m_all > 0)  # fixed by the measurement alone: the residual vector keeps its size
        sub = rows[keep]
        m = sub[col + "_m"].to_numpy(dtype=float)
        s = np.where(sub["status_s"].to_numpy() == "finished", sub[col + "_s"].to_numpy(dtype=float), np.nan)
        if col == "ttft_s":
            num_compared = int(np.isfinite(s).sum())
        # Identical requests arriving together are exchangeable (the engine orders such ties by receipt):
        # compare them as sorted groups, not by id.
        key = sub[["arrival_s", "prompt_tokens", "output_tokens_target"]].to_numpy(dtype=float)
        if len(key):
            _, group = np.unique(key, axis=0, return_inverse=True)
            group = group.reshape(-1)
            order = np.lexsort((m, group))
            m = m[order]
            s_sorted = s[np.lexsort((np.nan_to_num(s, nan=np.inf), group))]
            s = s_sorted
        ok = np.isfinite(s) & (s > 0)
        r = np.full(len(m), penalty)
        r[ok] = np.log(s[ok]) - np.log(m[ok])
        robust = np.sign(r) * np.sqrt(_soft_l1(r, scale))
        parts.append(robust / math.sqrt(len(r)) if len(r) else robust)
        medians.append(float(np.median(r[ok])) if ok.any() else math.nan)
    residuals = np.concatenate(parts)
    return RunErrors(loss=float(residuals @ residuals), ttft_log_ratio=medians[0], tpot_log_ratio=medians[1],
                     num_compared=num_compared, residuals=residuals)


def engine_errors(run: CalibrationRun, coefficients: LatencyCoefficients, scale: float = 0.1,
                  cpu_normalize: bool = True) -> RunErrors:
    """Simulate ``run`` and compare its mean prefill and decode time (``first_token - first_scheduled`` and
    ``end - first_token`` of the finished requests) with the engine-side means vLLM measured (``run.engine``).
    Residuals: the robust log-ratios of both (decode left out when no request decodes); a run the simulation
    does not finish counts as a factor-2 error.  ``cpu_normalize``: compare with the measured times scaled by
    the run's ``cpu_share`` (the engine's speed on a core of its own) where it was recorded."""
    sim = simulate(run.workload, run.config, run.model, run.gpu, coefficients=coefficients, seed=run.seed,
                   record_steps=False).requests
    done = sim[sim["status"] == "finished"]
    penalty = math.log(2.0)
    ratios = []
    for key, values in (("prefill_time", done["first_token_s"] - done["first_scheduled_s"]),
                        ("decode_time", done["end_s"] - done["first_token_s"])):
        # A CPU engine that got a share s of its core ran its steps 1/s times slower than on a core of its own:
        # the fit is to the engine's speed on a dedicated core (times s), when the share was recorded.
        measured = run.engine.get(key, math.nan) * (run.engine.get("cpu_share", 1.0) if cpu_normalize else 1.0)
        if not measured > 0:
            ratios.append(math.nan)
            continue
        simulated = float(values.mean()) if len(done) == len(sim) and len(done) else math.nan
        ratios.append(math.log(simulated / measured) if simulated > 0 else penalty)
    r = np.array([x for x in ratios if x == x])
    robust = np.sign(r) * np.sqrt(_soft_l1(r, scale)) / math.sqrt(max(1, len(r)))
    return RunErrors(loss=float(robust @ robust), ttft_log_ratio=ratios[0], tpot_log_ratio=ratios[1],
                     num_compared=len(done), residuals=robust)


def _run_steps(run: CalibrationRun) -> tuple[np.ndarray, list, object, np.ndarray, np.ndarray]:
    """(targets, shapes, resolved plan, steps after an idle spell, sequences each step prefills) of ``run``'s
    engine steps, computed once per run (the fit evaluates them hundreds of times)."""
    cached = run.__dict__.get("_step_cache")
    if cached is None:
        plan = resolve_engine(run.config, run.model, run.gpu)
        shapes = step_shapes(run.steps, plan.sizing.num_gpu_blocks, int(plan.config.block_size))
        cached = (step_targets(run.steps), shapes, plan, after_idle(run.steps), prefilling(shapes))
        run.__dict__["_step_cache"] = cached
    return cached


def run_max_num_seqs(run: CalibrationRun) -> int:
    """The ``max_num_seqs`` of the engine ``run`` probed, as its config resolves for its device (the plan
    :func:`_run_steps` resolved once for the steps fit)."""
    return int(_run_steps(run)[2].config.max_num_seqs)


def has_steps(run: CalibrationRun) -> bool:
    """Whether ``run`` recorded engine steps that a fit can compare (:func:`step_errors`)."""
    return run.steps is not None and len(run.steps) > 0 and bool(np.isfinite(step_targets(run.steps)).any())


#: Steps a run of the fit has on the scale of its residuals (every step weighs alike across runs: a run of
#: hundreds of busy steps says more than a prefill's four).
STEP_NORM = 50.0


def step_errors(run: CalibrationRun, coefficients: LatencyCoefficients, scale: float = 0.1) -> RunErrors:
    """Compare each engine step ``run`` recorded (:mod:`replay.calibration.step_log`) with the latency model's
    duration of a step of that shape: no simulation of the run, so no scheduling difference between the
    simulator and the engine enters the fit, only the step times.

    Residuals: the robust log-ratio of every step, scaled so that each run's steps weigh as one residual, and one
    more for the run's total (simulated over measured time of its steps: what its throughput follows).  A step
    after an idle spell is compared without ``per_prefill_seq_overhead_s``: the per-request host work it stands
    for was done while the engine idled (:func:`~replay.calibration.step_log.after_idle`).  ``ttft_log_ratio`` /
    ``tpot_log_ratio`` hold the median over the steps that prefill and over the decode-only steps."""
    targets, shapes, plan, idle, prefills = _run_steps(run)
    latency = roofline_for(plan.config, run.model, run.gpu, coefficients)
    credit = idle * prefills * coefficients.per_prefill_seq_overhead_s
    r, total_sim, total_meas = log_errors(targets, shapes, latency, credit)
    keep = np.isfinite(targets) & (targets > 0)
    prefill = (prefills > 0)[keep]
    per_step = np.sign(r) * np.sqrt(_soft_l1(r, scale))
    total = math.log(total_sim / total_meas) if total_sim > 0 and total_meas > 0 else math.log(2.0)
    weight = math.sqrt(max(1, len(r)))
    robust = np.append(per_step, weight * math.copysign(math.sqrt(_soft_l1(np.array([total]), scale)[0]), total))
    robust = robust / math.sqrt(STEP_NORM)
    return RunErrors(loss=float(robust @ robust),
                     ttft_log_ratio=float(np.median(r[prefill])) if prefill.any() else math.nan,
                     tpot_log_ratio=float(np.median(r[~prefill])) if (~prefill).any() else math.nan,
                     num_compared=len(r), residuals=robust)


#: A run whose engine used less CPU than this has too coarse a CPU share (10 ms clock ticks, the worker waking
#: up): it is given the median share of the longer runs instead.
MIN_SHARE_CPU_S = 1.0


#: Most of its core an engine can get: a larger recorded share (CPU seconds of polling threads outside the
#: requests' span, on a short run) is clipped to it, else it would make the engine look faster than a core.
MAX_SHARE = 1.0


def _steady_shares(runs: Sequence[CalibrationRun]) -> list[CalibrationRun]:
    """The runs with the CPU share of the short ones (``MIN_SHARE_CPU_S``) replaced by the median of the others,
    and every share clipped to ``MAX_SHARE`` (the raw value kept as ``cpu_share_raw``)."""
    long = [min(MAX_SHARE, r.engine["cpu_share"]) for r in runs if "cpu_share" in r.engine
            and r.engine.get("engine_cpu_s", math.inf) >= MIN_SHARE_CPU_S]
    median = float(np.median(long)) if long else math.nan
    out = []
    for run in runs:
        if "cpu_share" in run.engine:
            share = run.engine["cpu_share"]
            if run.engine.get("engine_cpu_s", math.inf) < MIN_SHARE_CPU_S and median == median:
                share = median
            run = dataclasses.replace(run, engine={**run.engine, "cpu_share": min(MAX_SHARE, share),
                                                   "cpu_share_raw": run.engine["cpu_share"]})
        out.append(run)
    return out


def frontend_latency(runs: Sequence[CalibrationRun]) -> ClientLatency:
    """What the client sees beyond the engine: median over runs of the mean client TTFT minus the engine's mean
    queue + prefill time (HTTP, request parsing and the first chunk's trip through the API server), measured,
    not fitted."""
    gaps = [run.engine["client_ttft"] - run.engine["queue_time"] - run.engine["prefill_time"]
            for run in runs if all(k in run.engine for k in ("client_ttft", "queue_time", "prefill_time"))]
    return ClientLatency(offset_s=max(0.0, float(np.median(gaps)))) if gaps else ClientLatency()


def with_client_latency(requests: pd.DataFrame, client: ClientLatency) -> pd.DataFrame:
    """A simulated request table as a client would see it: every token later by ``client.offset_s`` (TTFT and
    E2E grow by it, TPOT does not change); :func:`sim.latency.add_client_latency`, which
    ``kvtune simulate --profile`` uses too."""
    return add_client_latency(requests, client.offset_s)

