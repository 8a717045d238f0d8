"""GPU replay and the digital twin (docs/design.md, 'Replay and the digital twin').

- ``ReplayBackend`` (TrialBackend): start vLLM (or the twin) with a trial's config, replay a workload open-loop
  with its timing, scrape ``/metrics``, return the request table and a step-like timeline.
- ``replay`` / ``replay_async`` / ``ReplayOptions`` / ``ReplayResult``: the load generator alone, against any
  OpenAI-compatible server.
- ``TwinEngine`` / ``make_app`` / ``serve``: the digital twin (``kvtune twin``).
- ``calibrate`` / ``load_profile``: fit the latency model's coefficients to replay results.
- ``engine_args`` / ``engine_flags`` / ``serve_command``: EngineConfig -> ``vllm serve`` flags.
- ``add_replay_parsers``: the ``twin``, ``replay`` and ``calibrate`` subcommands.

Names are imported lazily so that ``import replay`` stays cheap.
"""

from __future__ import annotations

from sim import lazy_getattr

_EXPORTS = {
    "ReplayBackend": "replay.backend",
    "summarize_results": "replay.backend",
    "ReplayOptions": "replay.loadgen",
    "ServerError": "replay.loadgen",
    "replay": "replay.loadgen",
    "replay_async": "replay.loadgen",
    "ReplayResult": "replay.results",
    "timeline_from_samples": "replay.results",
    "MetricsSnapshot": "replay.prom",
    "parse_metrics": "replay.prom",
    "EngineProcess": "replay.launcher",
    "EngineStartError": "replay.launcher",
    "free_port": "replay.launcher",
    "twin_command": "replay.launcher",
    "engine_args": "replay.flags",
    "engine_flags": "replay.flags",
    "serve_command": "replay.flags",
    "config_yaml": "replay.flags",
    "TwinEngine": "replay.twin_engine",
    "build_core": "replay.twin_engine",
    "make_app": "replay.twin_server",
    "serve": "replay.twin_server",
    "calibrate": "replay.calibrate",
    "CalibrationFit": "replay.calibrate",
    "load_profile": "replay.calibrate",
    "save_profile": "replay.calibrate",
    "load_runs": "replay.calibrate",
    "add_replay_parsers": "replay.cli",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
