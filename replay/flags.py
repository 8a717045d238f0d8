"""EngineConfig -> ``vllm serve`` flags for a target vLLM version, to launch a trial's engine.

The flag names (``optimizer._knobs.VLLM_FLAGS``) and which release has which flag
(``optimizer/data/vllm_flags.yaml`` through ``optimizer._versions.VllmTarget``) are the optimizer's, so that the
engine a replay launches and the config ``kvtune export`` recommends are written the same way; the rules for
values that need no flag follow ``optimizer._export.vllm_config``.  Differences, because here an engine is
started rather than a file written: only knobs that are set (not ``None``) are passed, so vLLM's own defaults
apply to the rest as they do in the simulator; and a set knob the target cannot take is an error under
``strict`` (the replay would not measure the trial's config), else dropped with a note.

kvtune's own policies (reserved KV fraction, predicted admission) have no vLLM flag: a real engine cannot run
them (the twin can).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from typing import Any

from sim.engine.config import EngineConfig
from sim.errors import ConfigError

#: The version kvtune's V1 semantics were read from (DESIGN section 4), used when none is given for V1.
DEFAULT_VLLM_VERSION = "0.33.0"


@dataclass(frozen=True)
class EngineArgs:
    """``args``: flag name (no dashes) -> value, in table order; ``env``: environment the engine needs;
    ``dropped``: knobs left out (``strict=False``); ``notes``: why."""

    args: dict[str, Any]
    env: dict[str, str]
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def argv(self) -> list[str]:
        out: list[str] = []
        for name, value in self.args.items():
            if isinstance(value, bool):
                out.append(f"--{name}" if value else f"--no-{name}")
            else:
                out.extend([f"--{name}", _fmt(value)])
        return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _target(config: EngineConfig, vllm_version: str | None):
    from optimizer._versions import VllmTarget, default_target

    if vllm_version is None:
        return default_target(config.flavor)
    return VllmTarget.parse(vllm_version)


def engine_args(config: EngineConfig, vllm_version: str | None = None, strict: bool = True) -> EngineArgs:
    """The ``vllm serve`` flags of ``config`` for ``vllm_version`` (default: the newest listed release of the
    config's engine).  Raises ConfigError (``strict``) for a knob the target cannot take."""
    from optimizer._knobs import KVTUNE_POLICIES, engine_flag_values

    target = _target(config, vllm_version)
    engine = "v1" if config.is_v1 else "v0"
    if engine not in target.engines:
        raise ConfigError("flavor", f"vLLM {target} has no {engine.upper()} engine ({config.flavor} cannot run on it)")
    dropped: list[str] = []
    notes: list[str] = []

    def refuse(name: str, why: str) -> None:
        if strict:
            raise ConfigError(name, f"{why}: a replay on vLLM {target} would not run the trial's config")
        dropped.append(name)
        notes.append(f"{name}: {why} (dropped)")

    defaults = {f.name: f.default for f in fields(EngineConfig)}
    for name in KVTUNE_POLICIES:
        if getattr(config, name) != defaults[name]:
            refuse(name, "is a kvtune policy with no vLLM flag (replay it on the twin)")
    args: dict[str, Any] = {}
    for name, flag, value in engine_flag_values(config):
        if not target.has_flag(flag):
            if (name == "enable_prefix_caching" and not config.is_v1) or (name == "watermark" and not value):
                continue  # the engine without the flag behaves as configured
            refuse(name, f"vLLM {target} has no --{flag}")
            continue
        if isinstance(value, bool) and not value and flag not in target.negatable:
            refuse(name, f"vLLM {target} cannot turn --{flag} off (no --no-{flag})")
            continue
        args[flag] = value
        if name == "kv_offloading_size_gb" and target.has_flag("kv-offloading-backend"):
            args["kv-offloading-backend"] = "native"
    env: dict[str, str] = {}
    if len(target.engines) > 1:
        env["VLLM_USE_V1"] = "1" if config.is_v1 else "0"  # releases that ship both engines: pin the tuned one
    return EngineArgs(args=args, env=env, dropped=tuple(dropped), notes=tuple(notes))


def engine_flags(config: EngineConfig, vllm_version: str | None = None, strict: bool = True) -> list[str]:
    """``engine_args(...).argv()``: e.g. ``["--max-num-seqs", "128", "--no-enable-prefix-caching"]``."""
    return engine_args(config, vllm_version, strict).argv()


def serve_command(
    model: str,
    config: EngineConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    vllm_version: str | None = None,
    served_model_name: str | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    executable: str = "vllm",
    strict: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment of ``vllm serve MODEL ...`` for a trial's config."""
    engine = engine_args(config, vllm_version, strict)
    argv = [*shlex.split(executable), "serve", model, "--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += engine.argv()
    argv += list(extra_args)
    return argv, engine.env


def config_yaml(config: EngineConfig, model: str | None = None, vllm_version: str | None = None,
                strict: bool = True) -> dict[str, Any]:
    """The ``vllm serve --config`` mapping (flag names as keys) that launches ``config``."""
    out: dict[str, Any] = {"model": model} if model else {}
    out.update(engine_args(config, vllm_version, strict).args)
    return out


__all__ = ["DEFAULT_VLLM_VERSION", "EngineArgs", "config_yaml", "engine_args", "engine_flags", "serve_command"]
