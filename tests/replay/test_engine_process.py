"""Launching an engine: its own process group, /health polling, a clean stop with escalation, a kept log."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from replay.launcher import EngineProcess, EngineStartError, free_port

SERVER = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys, time
    ignore_sigint = sys.argv[2] == "stubborn"
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a worker in the group
    print("CHILD-PID", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    time.sleep(0.3)  # not healthy at once
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["polite", "stubborn"])
def test_start_wait_healthy_and_stop_the_whole_group(tmp_path, mode):
    port = free_port()
    proc = EngineProcess([sys.executable, "-c", SERVER, str(port), mode], f"http://127.0.0.1:{port}",
                         log_path=tmp_path / "engine.log", startup_timeout_s=20, stop_timeout_s=1)
    with proc:
        assert proc.running
        child = int(next(line.split()[1] for line in proc.log_tail().splitlines() if line.startswith("CHILD-PID")))
        assert _alive(child)
    assert not proc.running
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # the worker went down with the group
    assert proc.returncode is not None
    assert "$ " in (tmp_path / "engine.log").read_text()  # the command line heads the log


def test_engine_that_dies_at_start_reports_its_log(tmp_path):
    port = free_port()
    argv = [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]
    proc = EngineProcess(argv, f"http://127.0.0.1:{port}", log_path=tmp_path / "engine.log", startup_timeout_s=20)
    with pytest.raises(EngineStartError, match="(?s)code 3.*CUDA out of memory"):
        with proc:
            pass


def test_engine_that_never_gets_healthy_times_out(tmp_path):
    port = free_port()
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = EngineProcess(argv, f"http://127.0.0.1:{port}", log_path=tmp_path / "engine.log", startup_timeout_s=1,
                         stop_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match="not healthy"):
        with proc:
            pass
    # Gave up after its 1 s start-up timeout, not after the child's 60 s sleep (a loose bound: a loaded machine
    # may take seconds to start and stop a process, never the minute that would mean it waited the child out).
    assert time.monotonic() - t0 < 45 and not proc.running


def test_engine_dies_with_the_process_that_started_it(tmp_path):
    """A trial worker killed outright (no stop()) must not leave its engine holding the GPU."""
    port = free_port()
    pid_file = tmp_path / "engine.pid"
    starter = textwrap.dedent(f"""
        import os, sys, time
        from replay.launcher import EngineProcess
        code = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
        proc = EngineProcess([sys.executable, "-c", code], "http://127.0.0.1:{port}",
                             log_path={str(tmp_path / 'e.log')!r})
        proc.start()
        time.sleep(600)
    """)
    import subprocess

    worker = subprocess.Popen([sys.executable, "-c", starter], env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.05)
    engine = int(pid_file.read_text())
    assert _alive(engine)
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 5
    while _alive(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(engine)
