"""``ReplayBackend``: a trial measured on a real engine (or on the twin) instead of simulated.

It implements the optimizer's ``TrialBackend``: ``run(params, seeds)`` builds the trial's EngineConfig
(``base_config`` updated with ``params``), starts the engine with it (``vllm serve`` or the twin, as a subprocess
in its own process group), waits for ``/health``, replays the seed's workload once per seed, stops the engine and
returns the flat metrics (``objectives.summarize`` of each seed's tables, averaged over seeds, as SimBackend
does).  ``run_trial`` returns the same plus the tables.  With ``url`` it replays against a server that is
already running (a list of servers: the load generator routes across them with ``options.router``); the trial's
params are then only recorded (the server keeps the config it was started with).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from optimizer import SimBackend, TrialBackend, TrialError, mean_metrics
from replay.compare import measured_engine_view
from replay.flags import serve_command
from replay.launcher import EngineProcess, EngineStartError, free_port, twin_command
from replay.loadgen import ReplayOptions, ReplayRequestError, ServerError, replay
from replay.results import ReplayResult
from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.profiles import load_model
from sim.workload.workload import Workload

log = logging.getLogger("kvtune.replay")

def guess_sim_model(model: str) -> str | None:
    """kvtune's profile for a served model: a built-in's name (``meta-llama/Meta-Llama-3-8B`` -> ``Llama-3-8B``),
    a local model folder's absolute path (its config.json is the profile), or None."""
    from sim.profiles import hf_config_path as config_path

    if config_path(model) is not None:
        return str(Path(model).expanduser().resolve())
    for candidate in (model, model.rstrip("/").rsplit("/", 1)[-1]):
        try:
            return load_model(candidate).name
        except ConfigError:
            continue
    return None


def replay_metrics(result: ReplayResult, classes) -> dict[str, float]:
    """``objectives.summarize`` of one replay (``Summary.to_dict`` keys), with what only the server's counters
    know: ``preemptions_total`` (and its mean per request) from ``vllm:num_preemptions_total``, since the
    request table cannot see per-request preemptions; plus ``replay.*`` diagnostics."""
    from objectives import summarize

    d = summarize(result.requests, result.steps, classes).to_dict()
    total = result.preemptions_total
    d["preemptions_total"] = total
    if len(result.requests) and total == total:
        d["preemptions_per_request.mean"] = total / len(result.requests)
    d["replay.send_lag_max_s"] = float(result.info.get("send_lag_max_s", math.nan))
    d["replay.close_lag_max_s"] = float(result.info.get("close_lag_max_s", math.nan))
    d["replay.wall_s"] = float(result.info.get("wall_s", math.nan))
    d["replay.num_errors"] = float(result.info.get("num_errors", 0))
    d["replay.iterations"] = result.counter_delta("iterations_total")
    for key, value in measured_engine_view(result).items():  # what only the server tells
        d[f"engine.{key}"] = value
    return d


def summarize_results(results: Sequence[ReplayResult], classes) -> dict[str, float]:
    """:func:`replay_metrics` of each run, averaged over runs (``optimizer.mean_metrics``)."""
    return mean_metrics([replay_metrics(r, classes) for r in results]) if results else {}


@dataclass
class ReplayTrial:
    """One trial's replays: the averaged metrics, and per seed the result (tables) and where it was saved."""

    metrics: dict[str, float]
    results: list[ReplayResult]
    paths: list[Path | None]
    config: dict[str, Any]
    engine_log: str | None = None
    seeds: list[int] = field(default_factory=list)

    @property
    def requests(self) -> list[pd.DataFrame]:
        return [r.requests for r in self.results]

    @property
    def steps(self) -> list[pd.DataFrame]:
        return [r.steps for r in self.results]


class ReplayBackend(TrialBackend):
    """TrialBackend replaying a workload on an engine started per trial (or on ``url``).

    ``workload``: as for SimBackend (a Workload, a WorkloadSpec with ``build(seed)``, a mapping or a callable
    ``seed -> Workload``).  ``model``: what the engine serves (vllm: HF id or path; twin: a profile name).
    ``engine``: ``vllm`` or ``twin``.  ``gpu`` / ``sim_model``: kvtune profiles, recorded with the results for
    calibration (the twin needs them).  ``speed``: replay that many times faster (the twin is started with the
    same speed; a real engine needs 1).  ``out_dir``: each trial's results and engine log are saved under it.
    ``twin_slack_ms``: the twin's ``--slack-ms`` (its engine clock runs that far behind so that every arrival is
    placed at its exact trace time; the load generator reads the slack from /metrics and keeps results in
    trace time).
    """

    name = "replay"

    def __init__(
        self,
        workload: Any,
        *,
        model: str,
        gpu: str | None = None,
        sim_model: str | None = None,
        url: str | Sequence[str] | None = None,
        engine: str = "vllm",
        base_config: dict[str, Any] | None = None,
        vllm_version: str | None = None,
        vllm_python: str | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        speed: float = 1.0,
        options: ReplayOptions | None = None,
        out_dir: str | Path | None = None,
        startup_timeout_s: float = 1800.0,
        stop_timeout_s: float = 60.0,
        coefficients: dict[str, Any] | None = None,
        profile: str | Path | None = None,
        served_model_name: str | None = None,
        twin_slack_ms: float = 250.0,
    ):
        if engine not in ("vllm", "twin"):
            raise ConfigError("engine", f"must be 'vllm' or 'twin', got {engine!r}")
        self._workloads = SimBackend(workload, model, gpu or "")
        self.model = model
        self.gpu = gpu
        self.sim_model = sim_model or guess_sim_model(model)
        #: The running servers (``url`` a list: the load generator routes across them, ``options.router``).
        self.urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else list(url or ()))]
        self.url = self.urls[0] if self.urls else None
        self.engine = engine
        self.base_config = dict(base_config or {})
        self.vllm_version = vllm_version
        self.vllm_python = vllm_python
        #: The vLLM environment launched per trial (engine vllm without url), found when the backend is made.
        self.install = None
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self.speed = float(speed)
        self.options = options or ReplayOptions()
        self.out_dir = Path(out_dir) if out_dir else None
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.coefficients = {k: float(v) for k, v in (coefficients or {}).items()}
        self.profile = profile
        self.served_model_name = served_model_name
        self.twin_slack_ms = float(twin_slack_ms)
        self._trial = 0
        self.last_startup_s = math.nan
        if engine == "twin" and not url:
            if not self.sim_model or not gpu:
                raise ConfigError("engine", "the twin needs a model profile (model or sim_model) and a gpu profile")
        if engine == "vllm" and not url and self.speed != 1.0:
            raise ConfigError("speed", "a real engine runs in real time: speed must be 1 (speed is for the twin)")
        if engine == "vllm" and not url:
            from replay.vllm_env import find_vllm

            self.install = find_vllm(vllm_python)

    # ---- the engine ------------------------------------------------------------------------------------
    def command(self, config: EngineConfig, port: int) -> tuple[list[str], dict[str, str]]:
        """argv and environment that start the engine for ``config`` on ``port``."""
        if self.engine == "twin":
            return twin_command(config, self.sim_model, self.gpu, host=self.host, port=port, speed=self.speed,
                                served_model_name=self.served_model_name, profile=self.profile,
                                coefficients=self.coefficients, slack_ms=self.twin_slack_ms)
        return serve_command(self.model, config, host=self.host, port=port, vllm_version=self.vllm_version,
                             served_model_name=self.served_model_name, extra_args=self.extra_args,
                             install=self.install)

    @contextlib.contextmanager
    def server(self, config: EngineConfig, log_path: Path | None = None) -> Iterator[str]:
        """The URL of a healthy engine running ``config`` (started here and stopped on exit, unless ``url``)."""
        if self.url:
            yield self.urls if len(self.urls) > 1 else self.url
            return
        port = self.port or free_port(self.host)
        argv, env = self.command(config, port)
        proc = EngineProcess(argv, f"http://{self.host}:{port}", env={**env, **self.env}, log_path=log_path,
                             startup_timeout_s=self.startup_timeout_s, stop_timeout_s=self.stop_timeout_s)
        t0 = time.perf_counter()
        with proc:
            #: Wall seconds from the engine's start until /health answered (the last one started).
            self.last_startup_s = time.perf_counter() - t0
            yield proc.base_url

    # ---- TrialBackend ----------------------------------------------------------------------------------
    def workload(self, seed: int) -> Workload:
        return self._workloads.workload(seed)

    def prepare(self, seeds: Sequence[int]) -> None:
        self._workloads.prepare(seeds)

    def run(self, params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, float]:
        """Metrics of ``params`` averaged over ``seeds`` (``Summary.to_dict`` keys plus ``replay.*``)."""
        return self.run_trial(params, seeds).metrics

    def run_trial(self, params: Mapping[str, Any], seeds: Sequence[int]) -> ReplayTrial:
        """Replay each seed's workload on an engine running ``base_config | params``; metrics and tables."""
        knobs = {**self.base_config, **dict(params or {})}
        config = EngineConfig.from_dict(knobs, where="params")
        if self.engine == "vllm" and not self.url:
            self.command(config, 0)  # fail before starting anything if vLLM cannot take it
        seeds = [int(s) for s in seeds] or [0]
        workloads = {seed: self.workload(seed) for seed in seeds}
        self._trial += 1
        trial_dir = None
        if self.out_dir is not None:
            # Unique across processes: Ray workers each hold a copy of this backend and its counter.
            stamp = time.strftime("%Y%m%dT%H%M%S")
            trial_dir = self.out_dir / f"trial-{self._trial:04d}-{stamp}-{uuid.uuid4().hex[:6]}"
            trial_dir.mkdir(parents=True, exist_ok=True)
        log_path = trial_dir / "engine.log" if trial_dir else None
        results: list[ReplayResult] = []
        paths: list[Path | None] = []
        t0 = time.perf_counter()
        try:
            with self.server(config, log_path) as url:
                for seed in seeds:
                    opts = dataclasses.replace(self.options, seed=seed, speed=self.speed)
                    failure = None
                    try:
                        result = replay(url, workloads[seed], opts)
                    except ReplayRequestError as exc:  # keep what was recorded, then fail the trial
                        result, failure = exc.result, exc
                    result.info["engine"] = "external" if self.url else self.engine
                    result.info["engine_view"] = measured_engine_view(result)
                    results.append(result)
                    path = None
                    if trial_dir is not None:
                        path = result.save(trial_dir / f"seed-{seed}", extra={"engine": self.describe(config)})
                    paths.append(path)
                    if failure is not None:
                        saved = f"; recorded in {path}" if path is not None else ""
                        raise ReplayRequestError(failure.message + saved)
        except (EngineStartError, ServerError) as exc:
            raise TrialError(str(exc)) from exc
        metrics = mean_metrics([replay_metrics(r, workloads[s].classes) for r, s in zip(results, seeds)])
        metrics["replay.wall_s"] = time.perf_counter() - t0
        if not self.url:
            metrics["replay.engine_startup_s"] = float(self.last_startup_s)
        return ReplayTrial(metrics=metrics, results=results, paths=paths, config=config.explicit_knobs(),
                           engine_log=str(log_path) if log_path else None, seeds=seeds)

    def describe(self, config: EngineConfig) -> dict[str, Any]:
        """What calibration needs to re-simulate a run (saved as ``engine`` in replay.json)."""
        return {
            "kind": "external" if self.url else self.engine,
            **({"urls": list(self.urls)} if len(self.urls) > 1 else {}),
            "model": self.model,
            "sim_model": self.sim_model,
            "gpu": self.gpu,
            "config": {k: v for k, v in config.explicit_knobs().items()},
            "vllm_version": ((self.vllm_version or (self.install.version if self.install else None))
                             if self.engine == "vllm" else None),
            "speed": self.speed,
            "coefficients": self.coefficients or None,
            "profile": str(self.profile) if self.profile else None,
        }


__all__ = ["ReplayBackend", "ReplayTrial", "guess_sim_model", "replay_metrics", "summarize_results"]
