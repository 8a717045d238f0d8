"""Settings and workloads of the real-engine tests (a module with a unique name, importable from the test files)."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.workload import Workload
from sim.workload.classes import RequestClass

#: Extra server arguments: no torch.compile, and with VLLM_CPU_KVCACHE_SPACE set (kvtune sets it for the CPU build)
#: no warm-up pass either (vllm 0.32 vllm/v1/worker/cpu_worker.py ``_should_warm_up_model``): start-up time.
FAST_START = ("--enforce-eager",)
BASE_KNOBS = {"block_size": 32, "max_model_len": 2048, "max_num_seqs": 64}
#: 100 blocks of 32 tokens, prefix caching off (the recorded scrape's server): preempts under a burst of requests.
SCARCE = {**BASE_KNOBS, "num_gpu_blocks_override": 100, "enable_prefix_caching": False}
#: 4,096 blocks (131k tokens: all 60 requests at once fit), prefix caching on.
AMPLE = {**BASE_KNOBS, "num_gpu_blocks_override": 4096}


#: The real-engine benchmark's folder (run.py, scale.py, workloads.py).
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "real_engine"


def load_benchmark(file: str, name: str):
    """``benchmarks/real_engine/<file>`` as the module ``name`` (a name of its own per test file), registered in
    ``sys.modules`` first: its dataclasses look their module up while the file runs."""
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_HANDED_OUT: set[int] = set()


def free_port_in(low: int = 18000, high: int = 18099) -> int:
    """A free localhost port in [low, high] (the range kept for these engines), never one handed out before in
    this session: an engine binds its port only minutes after it starts."""
    for port in range(low, high + 1):
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def sixty_requests(seed: int = 0, n: int = 60, rate_rps: float = 4.0) -> Workload:
    """The recipe's load: Poisson arrivals at ``rate_rps``, prompts 50-800 tokens, outputs 20-200 (seeded)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_rps, n))
    df = pd.DataFrame({
        "request_id": np.arange(n),
        "class": "default",
        "arrival_s": arrivals - arrivals[0],
        "prompt_tokens": rng.integers(50, 801, n),
        "output_tokens": rng.integers(20, 201, n),
    })
    return Workload(df, {"default": RequestClass("default")}, source=f"sixty_requests(seed={seed})")
