"""The workload a simulation or replay runs: one row per request, plus the classes those rows belong to."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.errors import ConfigError
from sim.fields import fail
from sim.workload._report import LoadReport
from sim.workload.classes import DEFAULT_CLASS, RequestClass

#: Columns every workload table has (``hash_ids`` is optional: shared-prefix block hashes, Mooncake style).
WORKLOAD_COLUMNS = ("request_id", "class", "arrival_s", "prompt_tokens", "output_tokens")

#: Tokens per ``hash_ids`` entry in Mooncake's traces: one id per 512-token block (Mooncake FAST'25 paper, appendix
#: on the released traces, kvcache-ai/Mooncake ``FAST25-release/Mooncake-FAST25.pdf``; vLLM's
#: ``vllm bench serve --timed-trace-chunk-hash-size`` help gives 512 for Moonshot's traces, 16 for Alibaba's Qwen
#: traces).  The default of :attr:`Workload.hash_block_tokens`.
MOONCAKE_HASH_BLOCK_TOKENS = 512
#: Largest ``hash_block_tokens`` accepted: no prompt is longer (``sim.workload._validate.MAX_TOKENS``).
MAX_HASH_BLOCK_TOKENS = 10**8


def check_hash_block_tokens(value: object, where: str = "hash_block_tokens") -> int:
    """``value`` as the tokens per hash id: a whole number in [1, 10**8]; a ConfigError naming ``where`` else."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_HASH_BLOCK_TOKENS:
        raise fail(where, f"a whole number of tokens per hash id in [1, {MAX_HASH_BLOCK_TOKENS:g}] (Mooncake's traces: "
                          f"{MOONCAKE_HASH_BLOCK_TOKENS}; a multiple of the engine's block_size)", value)
    return int(value)


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival, and the class table.

    ``requests`` columns: ``request_id`` (int, unique), ``class`` (str, a key of ``classes``), ``arrival_s``
    (float, seconds from the start, non-decreasing), ``prompt_tokens`` (int >= 1), ``output_tokens``
    (int >= 1); optionally ``hash_ids`` (list of ints per row).  Any other column is kept and ignored.

    ``hash_block_tokens``: how many prompt tokens each ``hash_ids`` entry names (Mooncake: 512).  A trace whose
    lengths were scaled by ``f`` keeps its prefix sharing with ``hash_block_tokens`` scaled by ``f`` too; the
    simulator maps each id onto ``hash_block_tokens / block_size`` engine blocks (``sim.runner``).
    """

    requests: pd.DataFrame
    classes: dict[str, RequestClass] = field(default_factory=lambda: {DEFAULT_CLASS: RequestClass(DEFAULT_CLASS)})
    source: str = "<memory>"
    #: What loading did to the trace's rows (skipped, failed, unmatched); ``None`` for workloads built in memory.
    report: LoadReport | None = field(default=None, compare=False)
    #: Prompt tokens per ``hash_ids`` entry (see the class docstring).
    hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash_block_tokens", check_hash_block_tokens(self.hash_block_tokens))
        missing = [c for c in WORKLOAD_COLUMNS if c not in self.requests.columns]
        if missing:
            raise ConfigError("workload", f"{self.source}: missing columns {missing}")
        unknown = set(self.requests["class"].unique()) - set(self.classes)
        if unknown:
            raise ConfigError("workload.classes", f"{self.source}: rows name classes with no definition: {sorted(unknown)}")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def span_s(self) -> float:
        if len(self.requests) == 0:
            return 0.0
        arrivals = self.requests["arrival_s"].to_numpy()
        return float(arrivals[-1] - arrivals[0])

    def with_requests(self, requests: pd.DataFrame) -> "Workload":
        return dataclasses.replace(self, requests=requests.reset_index(drop=True))

    def with_hash_block_tokens(self, tokens: int) -> "Workload":
        """The same requests with ``tokens`` prompt tokens per ``hash_ids`` entry."""
        return dataclasses.replace(self, hash_block_tokens=check_hash_block_tokens(tokens))

    def scale_rate(self, factor: float) -> "Workload":
        """Compress arrival times ``factor``-fold (x2 doubles the request rate)."""
        if not factor > 0:
            raise fail("rate_scale", "> 0", factor)
        df = self.requests.copy()
        df["arrival_s"] = df["arrival_s"] / factor
        return self.with_requests(df)

    def head(self, num_requests: int) -> "Workload":
        return self.with_requests(self.requests.iloc[:num_requests].copy())

    def client_deadlines(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Per request: absolute timeout time and absolute cancel time (``inf`` when none), drawn with ``seed``.

        Drawn once per workload and seed so that every config in a study sees the same clients.
        """
        n = len(self.requests)
        rng = np.random.default_rng(seed)
        arrivals = self.requests["arrival_s"].to_numpy(dtype=float)
        names = self.requests["class"].to_numpy()
        timeout_at = np.full(n, np.inf)
        cancel_at = np.full(n, np.inf)
        draws = rng.random(n)
        delays = rng.random(n)
        for name, cls in self.classes.items():
            mask = names == name
            if not mask.any():
                continue
            if cls.timeout_s is not None:
                timeout_at[mask] = arrivals[mask] + cls.timeout_s
            if cls.cancel_probability > 0:
                low, high = cls.cancel_after_s
                cancels = mask & (draws < cls.cancel_probability)
                cancel_at[cancels] = arrivals[cancels] + low + (high - low) * delays[cancels]
        return timeout_at, cancel_at

    def priorities(self) -> np.ndarray:
        names = self.requests["class"].to_numpy()
        out = np.zeros(len(names), dtype=np.int64)
        for name, cls in self.classes.items():
            out[names == name] = cls.priority
        return out

    def window(self, start_s: float = 0.0, end_s: float | None = None) -> "Workload":
        """Requests arriving in ``[start_s, end_s)``, shifted so the window starts at 0 (request ids kept)."""
        if not start_s >= 0:
            raise fail("window.start_s", ">= 0", start_s)
        if end_s is not None and not end_s > start_s:
            raise fail("window.end_s", f"> start_s ({start_s!r})", end_s)
        arrivals = self.requests["arrival_s"]
        keep = arrivals >= start_s
        if end_s is not None:
            keep &= arrivals < end_s
        df = self.requests.loc[keep].copy()
        df["arrival_s"] = df["arrival_s"] - start_s
        return self.with_requests(df)

    def concat(self, other: "Workload", gap_s: float = 0.0) -> "Workload":
        """``other`` played after this workload: its arrivals shifted to start ``gap_s`` after this one's last.

        Request ids of ``other`` are offset to stay unique; classes are merged (one name, one definition).
        """
        if not gap_s >= 0:
            raise fail("gap_s", ">= 0", gap_s)
        for name, cls in other.classes.items():
            if name in self.classes and self.classes[name] != cls:
                raise ConfigError(f"classes.{name}", "the two workloads define this class differently")
        if self.hash_block_tokens != other.hash_block_tokens:
            raise ConfigError("hash_block_tokens", f"the two workloads' hash ids name blocks of different sizes "
                                                   f"({self.hash_block_tokens} and {other.hash_block_tokens} tokens)")
        mine = self.requests
        theirs = other.requests.copy()
        end = float(mine["arrival_s"].iloc[-1]) if len(mine) else 0.0
        theirs["arrival_s"] = theirs["arrival_s"] + end + gap_s
        if len(mine) and len(theirs):
            theirs["request_id"] = theirs["request_id"] - theirs["request_id"].min() + mine["request_id"].max() + 1
        frames = [f for f in (mine, theirs) if len(f)] or [mine]
        df = pd.concat(frames, ignore_index=True)
        return Workload(requests=df, classes={**self.classes, **other.classes},
                        source=f"{self.source} + {other.source}", hash_block_tokens=self.hash_block_tokens)
