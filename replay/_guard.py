"""Run a command that dies with the process that started it (Linux ``PR_SET_PDEATHSIG``), then exec it.

``python _guard.py PARENT_PID CMD ARGS...``: the engine server a replay starts must not outlive a trial worker
that was killed (a Ray task cancelled on timeout, say), or it would hold the GPU.  Setting the parent-death
signal here, in a fresh single-threaded process just before ``exec``, avoids ``preexec_fn`` in a threaded parent.
The signal is SIGTERM, which vLLM (and the twin) turn into a clean shutdown.
"""

import os
import signal
import sys


def main() -> None:
    parent = int(sys.argv[1])
    argv = sys.argv[2:]
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        sys.exit(75)  # the parent is already gone: start nothing
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
