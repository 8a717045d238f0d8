"""Fitting the latency coefficients to calibration runs: ``calibrate`` and its result, ``CalibrationFit``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from replay.calibration.engine_timing import at_cpu_share
from replay.calibration.loss import (_CLIENT_PARAMS, ClientLatency, RunErrors, _steady_shares, engine_errors,
                                     frontend_latency, run_errors)
from replay.calibration.runs import CalibrationRun
from replay.calibration.solvers import levenberg_marquardt, nelder_mead
from sim.errors import ConfigError, KvtuneError
from sim.latency import PROFILE_KIND, LatencyCoefficients

DEFAULT_FIT_PARAMS = ("overhead_s", "per_seq_overhead_s", "mfu", "bw_eff")
#: Physical bounds of each coefficient (the fit never leaves them).
BOUNDS: dict[str, tuple[float, float]] = {
    "overhead_s": (1e-5, 0.5),
    "per_seq_overhead_s": (1e-8, 1e-2),
    "mfu": (0.01, 1.0),
    "bw_eff": (0.01, 1.0),
    "link_eff": (0.01, 1.0),
    "per_copy_overhead_s": (1e-8, 1e-2),
    "allreduce_latency_s": (1e-8, 1e-3),
}



@dataclass
class CalibrationFit:
    """The fitted coefficients and how well they (and the start) explain the runs."""

    coefficients: LatencyCoefficients
    start: LatencyCoefficients
    params: tuple[str, ...]
    loss_start: float
    loss: float
    evaluations: int
    errors: list[RunErrors] = field(default_factory=list)
    model: str = ""
    gpu: str = ""
    sources: list[str] = field(default_factory=list)
    #: Fitted client-side TTFT latency (not part of the engine model; reported only).
    client: ClientLatency = field(default_factory=ClientLatency)
    #: Probe phase of each run ("" for a trace replay).
    phases: list[str] = field(default_factory=list)
    #: What was fitted: ``engine`` (vLLM's engine-side means) or ``client`` (per-request client timings).
    target: str = "client"
    #: Median over the runs of the engine's CPU share (:func:`cpu_share`); NaN when not recorded.  With it the
    #: engine target fits the engine's speed on a core of its own (``coefficients``), and the profile file holds
    #: them at this share (:attr:`profile_coefficients`: the engine as it ran, on a machine as loaded).
    cpu_share_median: float = math.nan

    @property
    def profile_coefficients(self) -> LatencyCoefficients:
        """What the profile file gives ``simulate``/``tune``/``twin``: the fitted coefficients at the engine's
        median CPU share (unchanged when no share was recorded, as on a GPU)."""
        return at_cpu_share(self.coefficients, self.cpu_share_median)

    def describe(self) -> str:
        lines = [f"fitted {', '.join(self.params)} to {self.target}-side timings of {len(self.sources)} run(s) in "
                 f"{self.evaluations} simulations: loss {self.loss_start:.4g} -> {self.loss:.4g}"]
        for name in self.params:
            lines.append(f"  {name}: {getattr(self.start, name):.6g} -> {getattr(self.coefficients, name):.6g}")
        if self.cpu_share_median == self.cpu_share_median:
            lines.append(f"  the engine got {self.cpu_share_median:.0%} of a core (median over the runs): the values "
                         f"above are its speed on a core of its own, the profile holds them at that share")
        if self.target == "engine":
            lines.append(f"  client-side latency beyond the engine (measured: client TTFT - engine queue+prefill, "
                         f"median over runs): {self.client.offset_s * 1e3:.1f} ms")
        elif self.client.offset_s or self.client.fanout_s:
            lines.append(f"  client-side TTFT latency (not in the profile): {self.client.offset_s * 1e3:.2f} ms "
                         f"+ {self.client.fanout_s * 1e6:.0f} us per stream served in the same step")
        first, second = ("prefill", "decode") if self.target == "engine" else ("TTFT", "TPOT")
        how = "run means" if self.target == "engine" else "median over each run's requests"
        lines.append(f"residuals (simulated / measured, {how}):")
        for src, err in zip(self.sources, self.errors):
            lines.append(f"  {src}: {first} x{math.exp(err.ttft_log_ratio):.3f}, "
                         f"{second} x{math.exp(err.tpot_log_ratio):.3f} over {err.num_compared} requests")
        phases = self.phase_residuals()
        if phases:
            lines.append("per phase, median |error| over its runs:")
            for phase, (ttft, tpot, n) in phases.items():
                lines.append(f"  {phase:8s} {first} {ttft:6.1%}  {second} {tpot:6.1%}  ({n} runs)")
        return "\n".join(lines)

    def phase_residuals(self) -> dict[str, tuple[float, float, int]]:
        """Per probe phase: median over its runs of |sim/measured - 1| of the median TTFT and TPOT, and the
        number of runs (runs without a phase are grouped as ``trace``)."""
        out: dict[str, list[tuple[float, float]]] = {}
        for phase, err in zip(self.phases or [""] * len(self.errors), self.errors):
            out.setdefault(phase or "trace", []).append((abs(math.expm1(err.ttft_log_ratio)),
                                                         abs(math.expm1(err.tpot_log_ratio))))
        return {k: (float(np.nanmedian([a for a, _ in v])), float(np.nanmedian([b for _, b in v])), len(v))
                for k, v in out.items()}

    def to_profile(self) -> dict:
        return {
            "kind": PROFILE_KIND,
            "model": self.model,
            "gpu": self.gpu,
            "coefficients": {k: float(v) for k, v in self.profile_coefficients.as_dict().items()},
            "fitted": list(self.params),
            "fit": {
                "target": self.target,
                "loss_start": float(self.loss_start),
                "loss": float(self.loss),
                "evaluations": int(self.evaluations),
                "runs": list(self.sources),
                "client_latency": {"offset_s": float(self.client.offset_s),
                                   "fanout_s": float(self.client.fanout_s)},
                "median_ttft_ratio": [float(math.exp(e.ttft_log_ratio)) for e in self.errors],
                "median_tpot_ratio": [float(math.exp(e.tpot_log_ratio)) for e in self.errors],
                "phase_median_abs_error": {k: {"ttft": v[0], "tpot": v[1], "runs": v[2]}
                                           for k, v in self.phase_residuals().items()},
                "cpu_share_median": self.cpu_share_median,
                "dedicated_core_coefficients": {k: float(v) for k, v in self.coefficients.as_dict().items()},
            },
        }


def calibrate(
    runs: Sequence[CalibrationRun],
    params: Sequence[str] = DEFAULT_FIT_PARAMS,
    start: LatencyCoefficients | None = None,
    max_evals: int = 400,
    scale: float = 0.1,
    fit_client_latency: bool = True,
    target: str = "auto",
) -> CalibrationFit:
    """Fit ``params`` (names of LatencyCoefficients fields) so that simulating ``runs`` reproduces them.

    ``target``: ``engine`` fits each run's mean prefill and decode time to the engine-side means vLLM exports
    (:func:`engine_errors`; the client-side latency is then measured, not fitted: :func:`frontend_latency`);
    ``client`` fits per-request TTFT and TPOT as the client saw them (:func:`run_errors`); ``auto``: engine
    when every run has the engine-side means (a real vLLM), else client (the twin exports none).
    ``fit_client_latency`` (client target): also fit the client-side part of TTFT (``ClientLatency``), so that
    HTTP time and the fan-out of a step's first tokens are not mistaken for engine overhead.
    """
    if not runs:
        raise KvtuneError("calibrate: no runs to fit")
    if target not in ("auto", "engine", "client"):
        raise ConfigError("--target", f"must be auto, engine or client, got {target!r}")
    has_engine = all("prefill_time" in run.engine and "decode_time" in run.engine for run in runs)
    if target == "engine" and not has_engine:
        missing = next(run.source for run in runs if "prefill_time" not in run.engine)
        raise ConfigError("--target", f"{missing}: no engine-side request timings (vllm:request_prefill_time_seconds)"
                                      " were recorded; use --target client")
    use_engine = target == "engine" or (target == "auto" and has_engine)
    if use_engine:
        fit_client_latency = False
        runs = _steady_shares(runs)
    params = tuple(params)
    for name in params:
        if name not in BOUNDS:
            raise ConfigError("--params", f"cannot fit {name!r}; fittable: {sorted(BOUNDS)}")
    if len(set(params)) != len(params) or not params:
        raise ConfigError("--params", "give each coefficient once, at least one")
    start = start or LatencyCoefficients()
    base = start.as_dict()
    # Coefficients are fitted as logarithms (they are scale parameters); the client latencies, which may be 0,
    # linearly (in units that make a step of ~0.1 meaningful).
    lows = np.log([BOUNDS[p][0] for p in params])
    highs = np.log([BOUNDS[p][1] for p in params])
    x_start = np.log([base[p] for p in params])
    client_params = _CLIENT_PARAMS if fit_client_latency else ()
    for _, upper, unit in client_params:
        lows = np.append(lows, 0.0)
        highs = np.append(highs, upper / unit)
        x_start = np.append(x_start, 0.1)

    def split(x: np.ndarray) -> tuple[LatencyCoefficients, ClientLatency]:
        x = np.clip(x, lows, highs)
        values = {p: float(math.exp(v)) for p, v in zip(params, x)}
        extra = {name: float(v) * unit for (name, _, unit), v in zip(client_params, x[len(params):])}
        return LatencyCoefficients(**{**base, **values}), ClientLatency(**extra)

    def errors(run: CalibrationRun, c: LatencyCoefficients, client: ClientLatency) -> RunErrors:
        return engine_errors(run, c, scale) if use_engine else run_errors(run, c, scale, client)

    def residuals(x: np.ndarray) -> np.ndarray:
        c, client = split(x)
        return np.concatenate([errors(run, c, client).residuals for run in runs]) / math.sqrt(len(runs))

    def loss(x: np.ndarray) -> float:
        r = residuals(x)
        # Outside the bounds: the clipped value's loss plus a wall, so the simplex comes back.
        return float(r @ r) + float(np.sum(np.maximum(0.0, lows - x) + np.maximum(0.0, x - highs)))

    x0 = np.clip(x_start, lows, highs)
    loss_start = sum(errors(run, start, ClientLatency()).loss for run in runs) / len(runs)
    # Levenberg-Marquardt does the work where the loss is smooth (timing-independent batches, as in the
    # probe); Nelder-Mead then polishes from there, which also copes with the kinks that scheduling changes
    # put into the loss of an arbitrary trace.
    x, best, evals = levenberg_marquardt(residuals, x0, lows, highs, max_evals=max(10, max_evals // 2))
    for step in (0.1, 0.03):
        if evals >= max_evals or best < 1e-14:
            break
        x2, best2, evals2 = nelder_mead(loss, x, step=step, max_evals=max_evals - evals)
        evals += evals2
        if best2 < best:
            x, best = x2, best2
    fitted, client = split(x)
    if use_engine:
        client = frontend_latency(runs)
    shares = [run.engine["cpu_share"] for run in runs if "cpu_share" in run.engine]
    return CalibrationFit(
        coefficients=fitted, start=start, params=params, loss_start=loss_start, loss=best, evaluations=evals,
        errors=[errors(run, fitted, client) for run in runs], model=runs[0].model.name, target="engine" if use_engine else "client",
        gpu=runs[0].gpu.name, sources=[run.source for run in runs], client=client,
        phases=[run.phase for run in runs],
        cpu_share_median=float(np.median(shares)) if shares and use_engine else math.nan,
    )

