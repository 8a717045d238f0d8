"""``kvtune calibrate``: fit the latency model's coefficients to replay measurements.

Simulation-based fit: for candidate coefficients, every replayed run is simulated (same workload slice, same
config, same seed, so the same clients) and the simulated per-request TTFT and TPOT are compared with the
measured ones, request by request, on a log scale (a soft-L1 loss, so that a few requests that the scheduler
happens to order differently do not dominate).  The coefficients are fitted in log space with Nelder-Mead
(numpy only), within physical bounds.  Identifiability: prefill-heavy steps are compute-bound (``mfu``), decode
steps memory-bound (``bw_eff``, with the KV read growing with context), and the step overhead is the intercept
of both; a workload with mixed prompt lengths and batch sizes separates them.

Profile file (YAML): ``{kind: kvtune-latency-profile, model, gpu, coefficients: {...all LatencyCoefficients
fields}, fitted: [...], fit: {...}}``; ``load_profile`` reads it (or a plain mapping of coefficients).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import yaml

from replay.results import ReplayResult
from sim.engine.config import EngineConfig
from sim.errors import ConfigError, KvtuneError
from sim.latency import LatencyCoefficients
from sim.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from sim.safe_yaml import read_yaml
from sim.engine.sizing import size_kv_cache
from sim.runner import simulate
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload

PROFILE_KIND = "kvtune-latency-profile"
DEFAULT_FIT_PARAMS = ("overhead_s", "per_seq_overhead_s", "mfu", "bw_eff")



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
_FIELDS = tuple(f.name for f in dataclasses.fields(LatencyCoefficients))


# ---- profiles ------------------------------------------------------------------------------------------
def coefficients_from_mapping(values: dict, where: str = "coefficients") -> LatencyCoefficients:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(where, f"unknown latency coefficients {unknown}; known: {list(_FIELDS)}")
    out = {}
    for key, value in values.items():
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{key}", f"must be a number, got {value!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{where}.{key}", f"must be a positive number, got {value!r}")
        out[key] = value
    return LatencyCoefficients(**out)


def load_profile(path: str | Path) -> LatencyCoefficients:
    """Coefficients from a profile YAML (``kvtune calibrate`` output, or a plain mapping of coefficients)."""
    path = Path(path)
    data = read_yaml(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError("profile", f"{path}: expected a mapping")
    values = data.get("coefficients", data)
    if not isinstance(values, dict):
        raise ConfigError("profile", f"{path}: 'coefficients' must be a mapping")
    return coefficients_from_mapping(values, where=str(path))


def coefficients_from(profile: str | Path | None,
                      overrides: dict[str, float] | None = None) -> LatencyCoefficients | None:
    """A profile file's coefficients with ``overrides`` applied; None when neither is given (model defaults)."""
    if profile is None and not overrides:
        return None
    base = load_profile(profile) if profile is not None else LatencyCoefficients()
    if overrides:
        merged = {**base.as_dict(), **overrides}
        return coefficients_from_mapping(merged, where="--coef")
    return base


# ---- the probe workload --------------------------------------------------------------------------------
PROBE_CLASS = "probe"


def probe_workload(
    model: ModelProfile,
    gpu: GpuProfile,
    config: EngineConfig | None = None,
    prompt_sweep: Sequence[int] = (128, 512, 1024, 2048, 3072),
    batch_sweep: Sequence[tuple[int, int, int]] = ((1, 128, 48), (1, 3000, 48), (16, 256, 48), (48, 128, 48),
                                                   (32, 3000, 128)),
    solo_output_tokens: int = 24,
    slowdown: float = 3.0,
) -> Workload:
    """A calibration workload whose batches do not depend on timing, so that the fit is well conditioned.

    Phase 1, prefill sweep: one request at a time per prompt length of ``prompt_sweep`` (``solo_output_tokens``
    out): its TTFT is one prefill step, compute-bound for long prompts (``mfu``, plus the overhead).  Phase 2,
    decode sweep: per ``(batch, prompt, output)`` of ``batch_sweep``, ``batch`` requests arriving together, so
    their decode steps run at that batch size and context (``bw_eff``, the overhead, the per-sequence
    overhead); the long-context batch reads about as many KV bytes as weights, which separates the step
    overhead from the memory efficiency.  A group is cut to half the KV cache.  Each group starts after the
    previous one has surely finished: its duration simulated with the default coefficients, times ``slowdown``,
    plus half a second.  Lengths are clipped to the config's ``max_model_len``; prompts that exceed the step
    budget are chunked, as on the engine.
    """
    config = (config or EngineConfig()).resolve(model.max_model_len, gpu)
    limit = int(config.max_model_len)
    sizing = size_kv_cache(model, gpu, config)
    capacity = (sizing.num_gpu_blocks - 1) * config.block_size  # tokens the KV cache holds
    groups: list[list[tuple[int, int]]] = []
    for prompt in prompt_sweep:
        p = max(1, min(int(prompt), limit - solo_output_tokens - 1))
        groups.append([(p, solo_output_tokens)])
    for batch, prompt, output in batch_sweep:
        out = max(2, int(output))
        p = max(1, min(int(prompt), limit - out - 1))
        # A group uses at most half the KV cache, so that it never preempts (which would depend on timing).
        fit = max(1, int(0.5 * capacity // (p + out)))
        groups.append([(p, out)] * max(1, min(int(batch), fit)))
    rows = []
    t = 0.0
    classes = {PROBE_CLASS: RequestClass(PROBE_CLASS)}
    for group in groups:
        for prompt, output in group:
            rows.append((len(rows), PROBE_CLASS, t, prompt, output))
        df = pd.DataFrame([(i, PROBE_CLASS, 0.0, p, o) for i, (p, o) in enumerate(group)],
                          columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
        alone = simulate(Workload(df, classes, source="probe"), config, model, gpu, record_steps=False)
        t += slowdown * float(alone.makespan_s) + 0.5
    frame = pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    return Workload(frame, classes, source="kvtune calibration probe")


# ---- runs ----------------------------------------------------------------------------------------------
@dataclass
class CalibrationRun:
    """One replayed run to fit: what was replayed, on which config, and what was measured."""

    workload: Workload
    config: EngineConfig
    model: ModelProfile
    gpu: GpuProfile
    seed: int
    measured: pd.DataFrame
    source: str = ""


def load_run(path: str | Path, model: str | None = None, gpu: str | None = None) -> CalibrationRun:
    """A replay result folder (``ReplayResult.save`` with the ``engine`` entry ReplayBackend writes)."""
    result, meta = ReplayResult.load(path)
    engine = meta.get("engine") or {}
    model_name = model or engine.get("sim_model")
    gpu_name = gpu or engine.get("gpu")
    if not model_name or not gpu_name:
        raise ConfigError("calibrate", f"{path}: the model and GPU profiles are not recorded; pass --model and --gpu")
    if result.workload is None:
        raise ConfigError("calibrate", f"{path}: no workload.parquet (the replayed workload is needed)")
    config = EngineConfig.from_dict(engine.get("config") or {}, where=f"{path}:engine.config")
    return CalibrationRun(
        workload=result.workload, config=config, model=load_model(model_name), gpu=load_gpu(gpu_name),
        seed=int(result.info.get("seed", 0)), measured=result.requests, source=str(path),
    )


def load_runs(paths: Sequence[str | Path], model: str | None = None, gpu: str | None = None) -> list[CalibrationRun]:
    return [load_run(p, model, gpu) for p in paths]


# ---- loss ----------------------------------------------------------------------------------------------
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


# ---- optimizer -----------------------------------------------------------------------------------------
def nelder_mead(
    f: Callable[[np.ndarray], float],
    x0: np.ndarray,
    step: float | np.ndarray = 0.3,
    max_evals: int = 300,
    xtol: float = 2e-3,
    ftol: float = 1e-7,
) -> tuple[np.ndarray, float, int]:
    """Minimize ``f`` from ``x0`` (standard coefficients: reflect 1, expand 2, contract 0.5, shrink 0.5).
    Returns (x, f(x), evaluations)."""
    x0 = np.asarray(x0, dtype=float)
    n = len(x0)
    steps = np.broadcast_to(np.asarray(step, dtype=float), (n,))
    simplex = [x0] + [x0 + steps[i] * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        spread_x = max(np.max(np.abs(x - simplex[0])) for x in simplex[1:])
        if spread_x < xtol and values[-1] - values[0] < ftol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        evals += 1
        if values[0] <= fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
            continue
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            evals += 1
            if fe < fr:
                simplex[-1], values[-1] = xe, fe
            else:
                simplex[-1], values[-1] = xr, fr
            continue
        # Contraction (outside if the reflection beat the worst, else inside).
        if fr < values[-1]:
            xc = centroid + 0.5 * (xr - centroid)
        else:
            xc = centroid + 0.5 * (worst - centroid)
        fc = f(xc)
        evals += 1
        if fc < min(fr, values[-1]):
            simplex[-1], values[-1] = xc, fc
            continue
        best = simplex[0]
        simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
        values = [values[0]] + [f(x) for x in simplex[1:]]
        evals += n
    i = int(np.argmin(values))
    return simplex[i], float(values[i]), evals


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    lows: np.ndarray,
    highs: np.ndarray,
    max_evals: int = 200,
    h: float = 1e-3,
    tol: float = 1e-10,
) -> tuple[np.ndarray, float, int]:
    """Minimize ``sum(residuals(x)**2)`` within ``[lows, highs]`` (forward-difference Jacobian, Marquardt's
    diagonal damping).  Returns (x, loss, evaluations)."""
    x = np.clip(np.asarray(x0, dtype=float), lows, highs)
    n = len(x)
    r = residuals(x)
    f = float(r @ r)
    evals = 1
    lam = 1e-3
    while evals + n + 1 <= max_evals:
        jac = np.empty((len(r), n))
        for i in range(n):
            step = h if x[i] + h <= highs[i] else -h
            xi = x.copy()
            xi[i] += step
            jac[:, i] = (residuals(xi) - r) / step
        evals += n
        a = jac.T @ jac
        g = jac.T @ r
        improved = False
        while evals < max_evals and lam < 1e10:
            damped = a + lam * np.diag(np.maximum(np.diag(a), 1e-12))
            try:
                dx = np.linalg.solve(damped, -g)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            x_new = np.clip(x + dx, lows, highs)
            r_new = residuals(x_new)
            evals += 1
            f_new = float(r_new @ r_new)
            if f_new < f:
                converged = f - f_new <= tol * max(f, 1e-30) or np.max(np.abs(x_new - x)) < 1e-6
                x, r, f = x_new, r_new, f_new
                lam = max(lam / 3.0, 1e-9)
                improved = True
                if converged:
                    return x, f, evals
                break
            lam *= 4.0
        if not improved:
            break
    return x, f, evals


# ---- fit -----------------------------------------------------------------------------------------------
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

    def describe(self) -> str:
        lines = [f"fitted {', '.join(self.params)} on {len(self.sources)} run(s) in {self.evaluations} simulations: "
                 f"loss {self.loss_start:.4g} -> {self.loss:.4g}"]
        for name in self.params:
            lines.append(f"  {name}: {getattr(self.start, name):.6g} -> {getattr(self.coefficients, name):.6g}")
        if self.client.offset_s or self.client.fanout_s:
            lines.append(f"  client-side TTFT latency (not in the profile): {self.client.offset_s * 1e3:.2f} ms "
                         f"+ {self.client.fanout_s * 1e6:.0f} us per stream served in the same step")
        for src, err in zip(self.sources, self.errors):
            lines.append(f"  {src}: median sim/measured TTFT x{math.exp(err.ttft_log_ratio):.3f}, "
                         f"TPOT x{math.exp(err.tpot_log_ratio):.3f} over {err.num_compared} requests")
        return "\n".join(lines)

    def to_profile(self) -> dict:
        return {
            "kind": PROFILE_KIND,
            "model": self.model,
            "gpu": self.gpu,
            "coefficients": {k: float(v) for k, v in self.coefficients.as_dict().items()},
            "fitted": list(self.params),
            "fit": {
                "loss_start": float(self.loss_start),
                "loss": float(self.loss),
                "evaluations": int(self.evaluations),
                "runs": list(self.sources),
                "client_latency": {"offset_s": float(self.client.offset_s),
                                   "fanout_s": float(self.client.fanout_s)},
                "median_ttft_ratio": [float(math.exp(e.ttft_log_ratio)) for e in self.errors],
                "median_tpot_ratio": [float(math.exp(e.tpot_log_ratio)) for e in self.errors],
            },
        }


def calibrate(
    runs: Sequence[CalibrationRun],
    params: Sequence[str] = DEFAULT_FIT_PARAMS,
    start: LatencyCoefficients | None = None,
    max_evals: int = 400,
    scale: float = 0.1,
    fit_client_latency: bool = True,
) -> CalibrationFit:
    """Fit ``params`` (names of LatencyCoefficients fields) so that simulating ``runs`` reproduces them.

    ``fit_client_latency``: also fit the client-side part of TTFT (``ClientLatency``), so that HTTP time and the
    fan-out of a step's first tokens are not mistaken for engine overhead.
    """
    if not runs:
        raise KvtuneError("calibrate: no runs to fit")
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

    def residuals(x: np.ndarray) -> np.ndarray:
        c, client = split(x)
        return np.concatenate([run_errors(run, c, scale, client).residuals for run in runs]) / math.sqrt(len(runs))

    def loss(x: np.ndarray) -> float:
        r = residuals(x)
        # Outside the bounds: the clipped value's loss plus a wall, so the simplex comes back.
        return float(r @ r) + float(np.sum(np.maximum(0.0, lows - x) + np.maximum(0.0, x - highs)))

    x0 = np.clip(x_start, lows, highs)
    loss_start = sum(run_errors(run, start, scale).loss for run in runs) / len(runs)
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
    return CalibrationFit(
        coefficients=fitted, start=start, params=params, loss_start=loss_start, loss=best, evaluations=evals,
        errors=[run_errors(run, fitted, scale, client) for run in runs], model=runs[0].model.name,
        gpu=runs[0].gpu.name, sources=[run.source for run in runs], client=client,
    )


def save_profile(fit: CalibrationFit, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fit.to_profile(), sort_keys=False))
    return path


__all__ = [
    "BOUNDS",
    "CalibrationFit",
    "ClientLatency",
    "PROBE_CLASS",
    "CalibrationRun",
    "DEFAULT_FIT_PARAMS",
    "calibrate",
    "coefficients_from",
    "load_profile",
    "load_run",
    "load_runs",
    "levenberg_marquardt",
    "nelder_mead",
    "probe_workload",
    "run_errors",
    "save_profile",
]
