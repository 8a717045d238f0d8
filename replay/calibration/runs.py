"""A calibration run: one replayed workload, the config it ran with, and what was measured; read back from a
replay result folder (``load_run``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from replay.calibration.engine_timing import engine_means
from replay.results import ReplayResult
from sim.engine import EngineConfig
from sim.errors import ConfigError
from sim.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from sim.workload.workload import Workload


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
    #: The probe's name (``ProbeGroup.name``): repeats of one probe share it; "" for a trace replay.
    probe: str = ""
    #: The machine the engine ran on (``sim.latency._profile_file.machine_device``), when recorded.
    device: dict | None = None
    #: The engine's own record of its steps during the run (``replay.calibration.step_log.read_steps``), when
    #: the engine was started to log them; None otherwise.
    steps: pd.DataFrame | None = None



def load_run(path: str | Path, model: str | None = None, gpu: str | None = None,
             _logs: dict | None = None) -> CalibrationRun:
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
    probe = str((meta.get("probe") or {}).get("name", ""))
    return CalibrationRun(
        workload=result.workload, config=config, model=load_model(model_name), gpu=load_gpu(gpu_name),
        seed=int(result.info.get("seed", 0)), measured=result.requests, source=str(path), phase=phase, probe=probe,
        engine=engine_means(result), device=meta.get("device") or None, steps=_saved_steps(Path(path), result.info, {} if _logs is None else _logs),
    )


#: A run folder's engine steps (``run_probes`` writes it beside the replay result).
STEPS_FILE = "engine_steps.parquet"


def _saved_steps(path: Path, info: dict, logs: dict) -> pd.DataFrame | None:
    """The engine steps of the run saved in ``path``: its ``engine_steps.parquet``, else the part of the engine
    log beside it (``kvtune calibrate --save-runs`` writes ``engine.log`` next to the runs) logged while it ran;
    None when neither is there or the log has no stamped step lines."""
    from replay.calibration.step_log import read_steps, steps_in

    file = path / STEPS_FILE
    if file.is_file():
        try:
            return pd.read_parquet(file)
        except (OSError, ValueError) as exc:
            raise ConfigError(str(file), f"unreadable engine steps ({exc})") from None
    log = path.parent / "engine.log"
    started, wall = info.get("started_unix"), info.get("wall_s")
    if not log.is_file() or started is None or wall is None:
        return None
    if log not in logs:  # the runs of one calibration share the log: read once
        try:
            logs[log] = read_steps(log)
        except ConfigError:
            logs[log] = None  # a log without kvtune's time stamps: no steps to fit, the other targets remain
    steps = logs[log]
    if steps is None:
        return None
    part = steps_in(steps, float(started), float(wall))
    return part if len(part) else None


def load_runs(paths: Sequence[str | Path], model: str | None = None, gpu: str | None = None) -> list[CalibrationRun]:
    logs: dict = {}
    return [load_run(p, model, gpu, logs) for p in paths]
