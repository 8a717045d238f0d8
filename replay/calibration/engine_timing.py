"""The engine's own timings, and how much of a core a CPU engine got while it ran them.

vLLM's engine core stamps each request's queue, prefill and decode time at step boundaries (``engine_means``:
the means over a run, from the ``/metrics`` histogram deltas).  On a CPU engine, whose steps stretch when
another process has its core, the kernel's per-thread ``schedstat`` (seconds on a core, seconds runnable but
waiting for one) says how much of its core the worker got (``contended_share``); ``at_cpu_share`` scales
coefficients to a share.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from replay.results import ReplayResult
from sim.latency import LatencyCoefficients

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

