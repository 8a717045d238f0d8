"""The traces of the conformance cases, on the tie-free time grid (``benchmarks/conformance/conformance.py``'s
docstring says why), and the CSV form both sides read: synthetic, a slice of the Azure trace, shared prefixes,
client deadlines.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

ARRIVAL_GRID_S = 2.0**-10
ARRIVAL_NUDGE_S = 2.0**-36


def on_time_grid(arrival_s: np.ndarray) -> np.ndarray:
    """Sorted arrivals moved onto the tie-free grid (see the module docstring); order is kept."""
    arrival_s = np.asarray(arrival_s, dtype=float)
    grid = np.floor(arrival_s / ARRIVAL_GRID_S) * ARRIVAL_GRID_S
    nudge = (2 * np.arange(len(arrival_s)) + 1) * ARRIVAL_NUDGE_S
    out = grid + nudge
    assert np.all(np.diff(out) > 0), "arrivals must be sorted"
    return out


def synthetic_trace(seed: int, num_requests: int, rate_per_s: float, prompt_median: int, prompt_max: int,
                    output_median: int, output_max: int, num_priorities: int = 3) -> pd.DataFrame:
    """Poisson arrivals, log-normal prompt and output lengths, random priorities (lower = more important)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    prompts = np.clip(np.round(rng.lognormal(math.log(prompt_median), 0.9, num_requests)), 1, prompt_max)
    outputs = np.clip(np.round(rng.lognormal(math.log(output_median), 0.8, num_requests)), 1, output_max)
    return pd.DataFrame({
        "arrival_s": on_time_grid(arrivals - arrivals[0]),
        "prompt_tokens": prompts.astype(int),
        "output_tokens": outputs.astype(int),
        "priority": rng.integers(0, num_priorities, num_requests),
    })


def azure_slice(path: str, start: int, num_requests: int, speedup: float, max_len: int,
                num_priorities: int = 3) -> pd.DataFrame:
    """``num_requests`` consecutive rows of an Azure trace CSV (arrival_s, prompt_tokens, output_tokens), rows
    whose prompt + output exceed ``max_len`` dropped, time compressed ``speedup``-fold; priority = row % k."""
    df = pd.read_csv(path)
    df = df[df.prompt_tokens + df.output_tokens <= max_len].iloc[start:start + num_requests]
    arrivals = (df.arrival_s.to_numpy(float) - float(df.arrival_s.iloc[0])) / speedup
    return pd.DataFrame({
        "arrival_s": on_time_grid(arrivals),
        "prompt_tokens": df.prompt_tokens.to_numpy(int),
        "output_tokens": df.output_tokens.to_numpy(int),
        "priority": np.arange(len(df)) % num_priorities,
    })


def write_trace(df: pd.DataFrame, path: str) -> None:
    """CSV with full float precision (``repr`` round-trips), the replay script's input format; optional
    ``hash_ids`` (space-separated) and ``timeout_s`` (empty: no deadline) columns for the lock-step driver."""
    extra = [c for c in ("hash_ids", "timeout_s") if c in df.columns]
    with open(path, "w") as f:
        f.write(",".join(["arrival_s", "prompt_tokens", "output_tokens", "priority", *extra]) + "\n")
        for i, (a, p, o, pr) in enumerate(zip(df.arrival_s, df.prompt_tokens, df.output_tokens, df.priority)):
            cells = [repr(float(a)), str(int(p)), str(int(o)), str(int(pr))]
            if "hash_ids" in extra:
                cells.append(" ".join(str(int(h)) for h in df.hash_ids.iloc[i]))
            if "timeout_s" in extra:
                t = df.timeout_s.iloc[i]
                cells.append("" if t is None or t != t else repr(float(t)))
            f.write(",".join(cells) + "\n")


def read_trace(path: str) -> pd.DataFrame:
    df = pd.read_csv(path, dtype={"arrival_s": str, "hash_ids": str, "timeout_s": str}, keep_default_na=False)
    df["arrival_s"] = df.arrival_s.map(float)  # Python's float() round-trips repr() exactly
    if "priority" not in df.columns:
        df["priority"] = 0
    if "hash_ids" in df.columns:
        df["hash_ids"] = [[int(x) for x in str(v).split()] for v in df.hash_ids]
    if "timeout_s" in df.columns:
        df["timeout_s"] = [float(v) if v != "" else float("nan") for v in df.timeout_s]
    return df


def shared_prefix_trace(seed: int, num_requests: int, rate_per_s: float, hash_block_tokens: int, num_groups: int,
                        max_ids: int, suffix_median: int, suffix_max: int, output_median: int, output_max: int,
                        num_priorities: int = 3) -> pd.DataFrame:
    """Poisson arrivals whose prompts start with a path of a prefix tree (``hash_ids``), then a suffix of at
    least one token of their own.  Per group: a trunk of 2 ids, then one of 2 branches; an id always sits at
    the same depth under the same parent, so equal ids mean equal prefixes (as in Mooncake's traces)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    hashes, prompts = [], []
    for _ in range(num_requests):
        group, branch, depth = int(rng.integers(num_groups)), int(rng.integers(1, 3)), int(rng.integers(0, max_ids + 1))
        ids = [group * 1000 + (m if m < 2 else branch * 100 + m) for m in range(depth)]
        suffix = int(np.clip(np.round(rng.lognormal(math.log(suffix_median), 0.9)), 1, suffix_max))
        hashes.append(ids)
        prompts.append(depth * hash_block_tokens + suffix)
    outputs = np.clip(np.round(rng.lognormal(math.log(output_median), 0.8, num_requests)), 1, output_max)
    return pd.DataFrame({
        "arrival_s": on_time_grid(arrivals - arrivals[0]),
        "prompt_tokens": np.array(prompts, dtype=int),
        "output_tokens": outputs.astype(int),
        "priority": rng.integers(0, num_priorities, num_requests),
        "hash_ids": hashes,
    })


def with_timeouts(df: pd.DataFrame, seed: int, timeouts_s: tuple[float, ...], share: float) -> pd.DataFrame:
    """A copy of ``df`` where a ``share`` of the requests (drawn with ``seed``) get a client deadline of one of
    ``timeouts_s`` after arrival.  Timeouts must be multiples of the arrival grid (2**-10 s), so that deadlines
    stay off step boundaries like the arrivals."""
    assert all((t / ARRIVAL_GRID_S).is_integer() for t in timeouts_s)
    rng = np.random.default_rng(seed)
    out = df.copy()
    picks = rng.choice(np.array(timeouts_s, dtype=float), len(df))
    out["timeout_s"] = np.where(rng.random(len(df)) < share, picks, np.nan)
    return out


def trace_max_model_len(df: pd.DataFrame) -> int:
    """The replay script's default max_model_len: the longest prompt + output of the trace."""
    return int((df.prompt_tokens + df.output_tokens).max())
