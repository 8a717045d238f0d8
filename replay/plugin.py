"""The replay package as a kvtune plugin (entry point ``kvtune.plugins``): the ``replay`` trial backend of a study
spec (``backend: {kind: replay, ...}``) and the ``twin``, ``replay`` and ``calibrate`` subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def replay_backend_from_spec(spec, ctx, out_dir: Path):
    """The ReplayBackend of ``spec.backend`` on the workloads ``ctx`` built; results under ``out_dir/replays``."""
    from optimizer import hf_model_id
    from replay.backend import ReplayBackend  # aiohttp & co.: only studies that replay need them

    b = spec.backend
    if b.engine == "twin":
        served = spec.model  # the twin simulates the spec's model profile
    else:
        served = b.model or hf_model_id(spec.model)
    kwargs: dict[str, Any] = {}
    if b.startup_timeout_s is not None:
        kwargs["startup_timeout_s"] = b.startup_timeout_s
    if b.twin_slack_ms is not None:
        kwargs["twin_slack_ms"] = b.twin_slack_ms
    for key in ("vllm_python", "port"):
        if getattr(b, key, None) is not None:
            kwargs[key] = getattr(b, key)
    if getattr(b, "vllm_args", None):
        kwargs["extra_args"] = tuple(b.vllm_args)
    return ReplayBackend(ctx.workloads, model=served, gpu=spec.gpu, sim_model=spec.model, url=b.url,
                         engine=b.engine or "vllm", base_config=spec.fixed_knobs(),
                         # A launched vLLM gets the flags of the release installed in its environment (the spec's
                         # vllm_version is what the recommendation is written for).
                         vllm_version=None, speed=b.speed, out_dir=Path(out_dir) / "replays", **kwargs)


def register() -> None:
    from optimizer import register_backend, register_commands
    from replay.cli import add_replay_parsers

    register_backend("replay", replay_backend_from_spec)
    register_commands(add_replay_parsers)


__all__ = ["register", "replay_backend_from_spec"]
