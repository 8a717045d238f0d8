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
    probe = str((meta.get("probe") or {}).get("name", ""))
    return CalibrationRun(
        workload=result.workload, config=config, model=load_model(model_name), gpu=load_gpu(gpu_name),
        seed=int(result.info.get("seed", 0)), measured=result.requests, source=str(path), phase=phase, probe=probe,
        engine=engine_means(result), device=meta.get("device") or None,
    )


def load_runs(paths: Sequence[str | Path], model: str | None = None, gpu: str | None = None) -> list[CalibrationRun]:
    return [load_run(p, model, gpu) for p in paths]

