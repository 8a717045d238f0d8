"""What a replay produces: the request table and a step-like timeline (docs/design.md, 'Data contracts'), and their
files.

Request table: the simulator's columns (``sim.tables.REQUEST_COLUMNS``), then ``reason`` (why a request did not
finish: a rejection's message, an error; None for finished requests).  What a client cannot see is NaN:
``first_scheduled_s``, ``queue_wait_s``, ``resume_wait_s``, ``num_preemptions``, ``recomputed_tokens``,
``swapped_out_blocks``, ``swapped_in_blocks``, ``kv_blocks_peak``, and ``prefix_hit_tokens`` unless the server
reports it (vLLM with ``--enable-prompt-tokens-details``: ``usage.prompt_tokens_details.cached_tokens``, the hit of
the request's first admission).  The run's total of preemptions comes from the server's counter
(``ReplayResult.preemptions_total``).

Timeline: one row per interval between two ``/metrics`` samples, in the step table's columns so that
``objectives`` reads it like a step table.  ``num_steps`` is the number of engine iterations in the interval
(``vllm:iteration_tokens_total`` count); ``duration_s`` the interval's length when the engine iterated in it,
else 0 (idle); ``prefill_tokens_new`` the prompt tokens counted in it (vLLM counts a prompt when its first token
comes out); ``decode_tokens`` the generation tokens; ``num_running``/``num_waiting``/``num_swapped`` the gauges
at the interval's end; ``kv_blocks_used`` = usage x ``kv_blocks_total`` (``vllm:cache_config_info``
num_gpu_blocks); ``preempted`` the preemptions in it.  ``prefill_tokens_recompute``, ``swap_out_blocks`` and
``swap_in_blocks`` are NaN (not exported by vLLM), so recompute shares come out NaN for replays.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from replay.prom import MetricsSnapshot, REQUEST_PREEMPTIONS
from sim.engine.core import STEP_COLUMNS
from sim.errors import KvtuneError
from sim.outputs import atomic_write, atomic_write_text
from sim.tables import REQUEST_COLUMNS
from sim.workload.classes import SLO, RequestClass
from sim.workload.workload import Workload

NAN = math.nan
#: Request-table columns a client cannot observe (NaN in replays).
UNOBSERVED_REQUEST_COLUMNS = (
    "first_scheduled_s", "queue_wait_s", "resume_wait_s", "num_preemptions", "recomputed_tokens",
    "swapped_out_blocks", "swapped_in_blocks", "kv_blocks_peak", "prefix_hit_tokens", "max_itl_s", "preempted_s",
    "time_prefill_new_s", "time_recompute_s", "time_decode_s", "time_overhead_s",
)
#: Column after the simulator's request columns: why the request did not finish (the server's message).
REASON_COLUMN = "reason"
#: Step-table columns /metrics does not give (NaN in the timeline).
UNOBSERVED_STEP_COLUMNS = ("prefill_tokens_recompute", "swap_out_blocks", "swap_in_blocks") + tuple(
    c for c in STEP_COLUMNS if c.startswith("time_"))


def request_table_from_records(workload: Workload, records, to_trace: Callable[[float], float]) -> pd.DataFrame:
    """The request table of a replay from the client's records (one per workload row, same order)."""
    df = workload.requests
    n = len(df)
    arrival = df["arrival_s"].to_numpy(dtype=float)
    first = np.array([to_trace(r.first_token) if r.first_token == r.first_token else NAN for r in records])
    # A timed-out or cancelled request ends at its deadline exactly (the simulator's convention).
    end = np.array([to_trace(r.end) if r.end == r.end else NAN for r in records], dtype=float)
    generated = np.array([r.tokens for r in records], dtype=np.int64)
    status = [r.status for r in records]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(generated > 1, (end - first) / (generated - 1), NAN)
    table = {
        "request_id": df["request_id"].to_numpy(dtype=np.int64),
        "class": df["class"].astype(str).tolist(),
        "arrival_s": arrival,
        "prompt_tokens": df["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens_target": df["output_tokens"].to_numpy(dtype=np.int64),
        "generated_tokens": generated,
        "status": status,
        "first_scheduled_s": np.full(n, NAN),
        "first_token_s": first,
        "end_s": end,
        "ttft_s": first - arrival,
        "e2e_s": end - arrival,
        "tpot_s": tpot,
    }
    out = pd.DataFrame(table)
    for col in REQUEST_COLUMNS:
        if col not in out.columns:
            out[col] = NAN
    out = out[list(REQUEST_COLUMNS)]
    # Why a request was not ``finished`` (the server's error message, a finish reason, ...); None otherwise.
    out[REASON_COLUMN] = pd.Series([r.error for r in records], dtype=object)
    return out


def _delta(after: float, before: float) -> float:
    if after != after or before != before:
        return NAN
    return max(0.0, after - before)  # a counter reset (server restart) never gives a negative delta


def timeline_from_samples(snaps: list[MetricsSnapshot]) -> pd.DataFrame:
    """Step-table-shaped rows between consecutive samples (see the module docstring)."""
    rows = []
    total_blocks = NAN
    for s in snaps:
        value = s.num_gpu_blocks()
        if value == value:
            total_blocks = value
    for k in range(1, len(snaps)):
        a, b = snaps[k - 1], snaps[k]
        iters = _delta(b.iterations(), a.iterations())
        prompt = _delta(b.total("vllm:prompt_tokens_total"), a.total("vllm:prompt_tokens_total"))
        gen = _delta(b.total("vllm:generation_tokens_total"), a.total("vllm:generation_tokens_total"))
        running = b.total("vllm:num_requests_running")
        interval = b.t_s - a.t_s
        if iters == iters:
            busy = iters > 0
        else:  # no iteration counter: busy when tokens came out or something ran
            busy = (gen > 0 if gen == gen else False) or (running > 0 if running == running else False)
        usage = b.kv_usage()
        rows.append({
            "step": k - 1,
            "num_steps": iters,
            "start_s": a.t_s,
            "duration_s": interval if busy else 0.0,
            "num_running": running,
            "num_waiting": b.total("vllm:num_requests_waiting"),
            "num_swapped": b.total("vllm:num_requests_swapped"),
            "prefill_tokens_new": prompt,
            "prefill_tokens_recompute": NAN,
            "decode_tokens": gen,
            "kv_blocks_used": round(usage * total_blocks) if usage == usage and total_blocks == total_blocks else NAN,
            "kv_blocks_total": total_blocks,
            "swap_out_blocks": NAN,
            "swap_in_blocks": NAN,
            "preempted": _delta(b.total("vllm:num_preemptions_total"), a.total("vllm:num_preemptions_total")),
        })
    df = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    return df.astype({c: "float64" for c in STEP_COLUMNS if c != "step"}).astype({"step": "int64"})


def samples_frame(snaps: list[MetricsSnapshot]) -> pd.DataFrame:
    """The raw samples: one row per scrape with the gauges and counters (trace seconds)."""
    return pd.DataFrame([{"t_s": s.t_s, **s.summary()} for s in snaps])


def _hist_delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None, name: str) -> dict[str, float]:
    if after is None:
        return {}
    b = before.histogram(name) if before is not None else {}
    return {("+Inf" if math.isinf(le) else repr(le)): v - b.get(le, 0.0) for le, v in after.histogram(name).items()}


@dataclass
class ReplayResult:
    """One replay run: the two tables, the raw samples, per-token times and what the server's counters said."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    samples: pd.DataFrame
    metrics_before: dict[str, float] = field(default_factory=dict)
    metrics_after: dict[str, float] = field(default_factory=dict)
    #: request_id -> arrival time of each generated token (trace seconds); None when not recorded.
    token_times: dict[int, np.ndarray] | None = None
    info: dict = field(default_factory=dict)
    workload: Workload | None = None

    @classmethod
    def from_snapshots(cls, requests, snaps, before, after, token_times, info, workload) -> "ReplayResult":
        info = dict(info)
        before_d = before.summary() if before is not None else {}
        after_d = after.summary() if after is not None else {}
        info["request_num_preemptions_hist"] = _hist_delta(before, after, REQUEST_PREEMPTIONS)
        return cls(
            requests=requests, steps=timeline_from_samples(snaps), samples=samples_frame(snaps),
            metrics_before=before_d, metrics_after=after_d, token_times=token_times, info=info, workload=workload,
        )

    def counter_delta(self, name: str) -> float:
        """After minus before of a ``MetricsSnapshot.summary`` key (NaN when not scraped)."""
        return _delta(self.metrics_after.get(name, NAN), self.metrics_before.get(name, NAN))

    @property
    def preemptions_total(self) -> float:
        """Preemptions during the run (``vllm:num_preemptions_total`` after minus before)."""
        return self.counter_delta("num_preemptions_total")

    # ---- files (each written to a temporary file and renamed: a full disk leaves no truncated file) ------
    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write ``requests.parquet``, ``steps.parquet``, ``samples.parquet``, ``tokens.parquet``,
        ``workload.parquet`` and ``replay.json`` (info, counters, classes, ``extra``) into folder ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_parquet(self.requests, path / "requests.parquet")
        _write_parquet(self.steps, path / "steps.parquet")
        _write_parquet(self.samples, path / "samples.parquet")
        if self.token_times is not None:
            ids = np.concatenate([np.full(len(v), k, dtype=np.int64) for k, v in self.token_times.items()]) \
                if self.token_times else np.zeros(0, dtype=np.int64)
            times = np.concatenate(list(self.token_times.values())) if self.token_times else np.zeros(0)
            _write_parquet(pd.DataFrame({"request_id": ids, "t_s": times}), path / "tokens.parquet")
        meta = {
            "info": self.info,
            "metrics_before": self.metrics_before,
            "metrics_after": self.metrics_after,
            **(extra or {}),
        }
        if self.workload is not None:
            wl = self.workload.requests
            cols = [c for c in wl.columns if c != "hash_ids"]
            _write_parquet(wl[cols], path / "workload.parquet")
            meta["classes"] = {name: dataclasses.asdict(c) for name, c in self.workload.classes.items()}
            meta["workload_source"] = self.workload.source
        atomic_write_text(path / "replay.json", json.dumps(meta, indent=2, default=_json_default))
        return path

    @classmethod
    def load(cls, path: str | Path) -> tuple["ReplayResult", dict]:
        """Read a folder written by :meth:`save`; returns the result and the whole ``replay.json``."""
        path = Path(path)
        meta_file = path / "replay.json"
        if not meta_file.is_file():
            raise KvtuneError(f"{path}: not a replay result folder (no replay.json)")
        meta = json.loads(meta_file.read_text())
        token_times = None
        if (path / "tokens.parquet").is_file():
            tokens = pd.read_parquet(path / "tokens.parquet")
            token_times = {int(k): g["t_s"].to_numpy() for k, g in tokens.groupby("request_id", sort=False)}
        workload = None
        if (path / "workload.parquet").is_file() and "classes" in meta:
            classes = {name: _class_from_dict(d) for name, d in meta["classes"].items()}
            workload = Workload(requests=pd.read_parquet(path / "workload.parquet"), classes=classes,
                                source=meta.get("workload_source", str(path)))
        result = cls(
            requests=pd.read_parquet(path / "requests.parquet"),
            steps=pd.read_parquet(path / "steps.parquet"),
            samples=(pd.read_parquet(path / "samples.parquet") if (path / "samples.parquet").is_file()
                     else pd.DataFrame()),
            metrics_before=meta.get("metrics_before", {}),
            metrics_after=meta.get("metrics_after", {}),
            token_times=token_times,
            info=meta.get("info", {}),
            workload=workload,
        )
        return result, meta


def _class_from_dict(d: dict) -> RequestClass:
    d = dict(d)
    slo = SLO(**(d.pop("slo", None) or {}))
    if "cancel_after_s" in d and d["cancel_after_s"] is not None:
        d["cancel_after_s"] = tuple(d["cancel_after_s"])
    return RequestClass(slo=slo, **d)


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


__all__ = [
    "REASON_COLUMN",
    "ReplayResult",
    "UNOBSERVED_REQUEST_COLUMNS",
    "UNOBSERVED_STEP_COLUMNS",
    "request_table_from_records",
    "samples_frame",
    "timeline_from_samples",
]


def _write_parquet(frame: pd.DataFrame, target: Path) -> None:
    with atomic_write(target) as tmp:
        frame.to_parquet(tmp, index=False)
