"""Start an engine server as a subprocess, wait until it is healthy, stop it cleanly, keep its log.

``EngineProcess`` runs any command (``vllm serve ...`` or the twin) in its own process group, with stdout and
stderr going to a log file; ``wait_ready`` polls ``GET /health`` and fails early, with the log's tail, if the
process exits first; ``stop`` sends SIGINT to the group (vLLM shuts down gracefully on it), then SIGTERM, then
SIGKILL, each after a timeout.  ``replay.flags.serve_command`` and ``twin_command`` build the argv for a trial's config.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from sim.engine.config import EngineConfig
from sim.errors import KvtuneError

log = logging.getLogger("kvtune.replay")

REPO_ROOT = Path(__file__).resolve().parent.parent
_GUARD = Path(__file__).resolve().with_name("_guard.py")
#: Engines started by this process and not yet stopped (stopped at interpreter exit).
_RUNNING: set["EngineProcess"] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_RUNNING):
        try:
            proc.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class EngineStartError(KvtuneError):
    """The engine exited or did not become healthy in time; the message carries its log's tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: Signals the engine must receive to stop cleanly (EngineProcess.stop sends SIGINT, then SIGTERM).
_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def _stop_signals_unblocked() -> Iterator[None]:
    """Unblock SIGINT/SIGTERM in this thread while an engine is spawned.  A child inherits the spawning thread's
    signal mask across exec, and a Ray worker runs tasks with SIGINT blocked: an engine started from a trial task
    then ignored EngineProcess.stop's SIGINT and every trial waited ``stop_timeout_s`` (60 s) for the SIGTERM."""
    blocked: set = set()
    if hasattr(signal, "pthread_sigmask"):
        blocked = _STOP_SIGNALS & set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))  # SIG_BLOCK of nothing: a query
    if not blocked:
        yield
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)



class EngineProcess:
    """One engine server process.  Use as a context manager: ``with EngineProcess(argv, url) as eng: ...``."""

    def __init__(
        self,
        argv: list[str],
        base_url: str,
        *,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 1800.0,
        stop_timeout_s: float = 60.0,
        cwd: str | Path | None = None,
        die_with_parent: bool = True,
    ):
        self.argv = [str(a) for a in argv]
        #: Linux: the engine gets SIGTERM if this process dies without stopping it (see replay/_guard.py).
        self.die_with_parent = die_with_parent
        self.base_url = base_url.rstrip("/")
        self.env = dict(env or {})
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="kvtune-engine-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.returncode: int | None = None

    # ---- start ---------------------------------------------------------------------------------------
    def start(self) -> "EngineProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        env = {**os.environ, **self.env}
        log.info("starting engine: %s (log %s)", " ".join(self.argv), self.log_path)
        argv = self.argv
        if self.die_with_parent and sys.platform.startswith("linux"):
            argv = [sys.executable, str(_GUARD), str(os.getpid()), *argv]
        with _stop_signals_unblocked():
            self.proc = subprocess.Popen(
                argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.cwd,
                start_new_session=True,  # its own process group: stop() reaches workers it forks
            )
        _RUNNING.add(self)
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll ``/health`` until HTTP 200; EngineStartError if the process exits or time runs out."""
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        url = self.base_url + "/health"
        while True:
            if self.proc is None:
                raise EngineStartError("engine not started")
            code = self.proc.poll()
            if code is not None:
                self.returncode = code
                raise EngineStartError(f"engine exited with code {code} before it was healthy; log {self.log_path}:\n"
                                       + self.log_tail())
            try:
                with urllib.request.urlopen(url, timeout=2.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise EngineStartError(f"engine not healthy at {url} after {self.startup_timeout_s:.0f}s; "
                                       f"log {self.log_path}:\n" + self.log_tail())
            time.sleep(0.25)

    # ---- stop ----------------------------------------------------------------------------------------
    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL to the process group; returns the exit code."""
        proc = self.proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            for sig, wait in ((signal.SIGINT, self.stop_timeout_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                self._signal(sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    log.warning("engine (pid %d) still running after %s; escalating", proc.pid,
                                signal.Signals(sig).name)
        else:
            # The leader is gone; make sure nothing it forked lingers in the group.
            self._signal(signal.SIGKILL)
        self.returncode = proc.returncode
        _RUNNING.discard(self)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.proc = None
        return self.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "EngineProcess":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- commands ------------------------------------------------------------------------------------------
def _knob_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def twin_command(
    config: EngineConfig,
    model: str,
    gpu: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    speed: float = 1.0,
    served_model_name: str | None = None,
    profile: str | Path | None = None,
    coefficients: dict[str, float] | None = None,
    predicted: dict[str, int] | None = None,
    slack_ms: float = 0.0,
    python: str = sys.executable,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of ``python -m replay twin`` serving ``config``."""
    argv = [python, "-m", "replay", "twin", "--model", model, "--gpu", gpu, "--host", host, "--port", str(port),
            "--speed", repr(float(speed))]
    for key, value in config.explicit_knobs().items():
        argv += ["--set", f"{key}={_knob_text(value)}"]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if profile:
        argv += ["--profile", str(profile)]
    for key, value in (coefficients or {}).items():
        argv += ["--coef", f"{key}={value!r}"]
    for key, value in (predicted or {}).items():
        argv += ["--predicted", f"{key}={int(value)}"]
    if slack_ms:
        argv += ["--slack-ms", repr(float(slack_ms))]
    path = os.environ.get("PYTHONPATH", "")
    env = {"PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else "")}
    return argv, env


__all__ = ["EngineProcess", "EngineStartError", "free_port", "twin_command"]
