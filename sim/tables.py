"""The request table and the step table (docs/design.md, 'Data contracts').

The request table is kept as compact arrays while the run goes (:class:`RequestLog`: a request's row is
written when it ends, so its live state can be dropped), and the step table as row tuples, optionally handed
on in chunks instead of kept (a study trial needs only step totals), or kept as columns chunk by chunk
(:class:`StepColumns`: ``kvtune simulate``, whose step table of a million requests as row tuples took ~600 MB).
"""

from __future__ import annotations

import struct
from itertools import starmap

import numpy as np
import pandas as pd

from sim.engine.core import STEP_COLUMNS
from sim.engine.request import OUTCOME_ATTRIBUTES, Request, Status, outcomes

#: A request's share of the steps' time parts (transfer is not attributed per request: see its swapped blocks).
REQUEST_TIME_COLUMNS = ("time_prefill_new_s", "time_recompute_s", "time_decode_s", "time_overhead_s")
REQUEST_COLUMNS = (
    "request_id", "class", "arrival_s", "prompt_tokens", "output_tokens_target", "generated_tokens", "status",
    "first_scheduled_s", "first_token_s", "end_s", "ttft_s", "e2e_s", "tpot_s", "queue_wait_s", "resume_wait_s",
    "num_preemptions", "recomputed_tokens", "swapped_out_blocks", "swapped_in_blocks", "kv_blocks_peak",
    "prefix_hit_tokens", "max_itl_s", "preempted_s",
) + REQUEST_TIME_COLUMNS

_STATUSES = tuple(Status)
_STATUS_CODE = {s: i for i, s in enumerate(_STATUSES)}
_STATUS_VALUES = np.array([s.value for s in _STATUSES], dtype=object)

#: Per-request counters copied from the live request when it ends: (column, Request attribute, dtype).
_COUNTERS = (
    ("generated_tokens", "num_output_tokens", np.int64),
    ("resume_wait_s", "resume_wait_s", np.float64),
    ("num_preemptions", "num_preemptions", np.int64),
    ("recomputed_tokens", "recomputed_tokens", np.int64),
    ("swapped_out_blocks", "swapped_out_blocks", np.int64),
    ("swapped_in_blocks", "swapped_in_blocks", np.int64),
    ("kv_blocks_peak", "kv_blocks_peak", np.int64),
    ("prefix_hit_tokens", "prefix_hit_tokens", np.int64),
    ("preempted_hit_tokens", "preempted_hit_tokens", np.int64),
    ("max_itl_s", "max_itl_s", np.float64),
    ("preempted_s", "preempted_s", np.float64),
) + tuple((c, c, np.float64) for c in REQUEST_TIME_COLUMNS)
_TIMES = (("first_scheduled_s", "first_scheduled_s"), ("first_token_s", "first_token_s"), ("end_s", "end_s"))


class RequestLog:
    """The request table's columns as arrays, one slot per workload request (``Request.index``).

    The workload's own columns are given at creation; :meth:`record_all` copies ended requests' outcomes into
    their slots.  A slot never recorded (the run stopped before the request ended) reads ``unfinished``, with
    whatever :meth:`record_all` last saw of it (nothing, for a request that never arrived).
    """

    def __init__(self, request_ids: np.ndarray, classes: np.ndarray, arrival_s: np.ndarray,
                 prompt_tokens: np.ndarray, output_tokens_target: np.ndarray):
        n = len(request_ids)
        self.request_ids = np.asarray(request_ids, dtype=np.int64)
        self.classes = np.asarray(classes, dtype=object)
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)
        self.output_tokens_target = np.asarray(output_tokens_target, dtype=np.int64)
        self.status = np.full(n, _STATUS_CODE[Status.UNFINISHED], dtype=np.int8)
        self.times = {name: np.full(n, np.nan) for name, _ in _TIMES}
        # A request never recorded reads as a request that never arrived: a fresh request's values.
        fresh = Request(0, 0, "", 0.0, 1, 1, 2)
        self.counters = {name: np.full(n, getattr(fresh, attr), dtype=dtype) for name, attr, dtype in _COUNTERS}

    def __len__(self) -> int:
        return len(self.request_ids)

    def record_all(self, reqs: list[Request]) -> None:
        """Copy each of ``reqs``' outcome (status, times, counters) into its row, one array assignment per column."""
        if not reqs:
            return
        rows = np.fromiter((r.index for r in reqs), dtype=np.int64, count=len(reqs))
        values = dict(zip(OUTCOME_ATTRIBUTES, outcomes(reqs)))  # (compiled field reads, not getattr by name)
        self.status[rows] = [_STATUS_CODE[s] for s in values["status"]]
        for name, attr in _TIMES:
            self.times[name][rows] = values[attr]
        for name, attr, _ in _COUNTERS:
            self.counters[name][rows] = values[attr]

    def table(self) -> pd.DataFrame:
        """One row per request of the workload, in arrival order, whatever its status."""
        arrival = self.arrival_s
        first_sched, first_token, end = (self.times[name] for name, _ in _TIMES)
        generated = self.counters["generated_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(generated > 1, (end - first_token) / (generated - 1), np.nan)
        c = self.counters
        return pd.DataFrame({
            "request_id": self.request_ids,
            "class": self.classes,
            "arrival_s": arrival,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens_target": self.output_tokens_target,
            "generated_tokens": generated,
            "status": _STATUS_VALUES[self.status],
            # Finished at max_model_len before its output target (vLLM's finish reason "length"): capped, not complete.
            "capped": (self.status == _STATUS_CODE[Status.FINISHED]) & (generated < self.output_tokens_target),
            "first_scheduled_s": first_sched,
            "first_token_s": first_token,
            "end_s": end,
            "ttft_s": first_token - arrival,
            "e2e_s": end - arrival,
            "tpot_s": tpot,
            "queue_wait_s": first_sched - arrival,
            "resume_wait_s": c["resume_wait_s"],
            "num_preemptions": c["num_preemptions"],
            "recomputed_tokens": c["recomputed_tokens"],
            "swapped_out_blocks": c["swapped_out_blocks"],
            "swapped_in_blocks": c["swapped_in_blocks"],
            "kv_blocks_peak": c["kv_blocks_peak"],
            "prefix_hit_tokens": c["prefix_hit_tokens"],
            # Not one of REQUEST_COLUMNS (like ``capped``; a replay cannot see it): hits of lookups after a preemption,
            # which vLLM does not export (``prefix_hit_tokens`` is the first admission's, as vllm:prefix_cache_hits).
            "preempted_hit_tokens": c["preempted_hit_tokens"],
            "max_itl_s": c["max_itl_s"],
            "preempted_s": c["preempted_s"],
            **{name: c[name] for name in REQUEST_TIME_COLUMNS},
        }, copy=False)


_FLOAT_STEP_COLUMNS = frozenset(c for c in STEP_COLUMNS if c in ("start_s", "duration_s") or c.startswith("time_"))
#: A step row as packed bytes: int64 for the count columns, float64 for the times (little-endian, as ``_ROW_DTYPE``).
_ROW = struct.Struct("<" + "".join("d" if c in _FLOAT_STEP_COLUMNS else "q" for c in STEP_COLUMNS))
_ROW_DTYPE = np.dtype([(c, "<f8" if c in _FLOAT_STEP_COLUMNS else "<i8") for c in STEP_COLUMNS])


def step_table(rows: list[tuple]) -> pd.DataFrame:
    """One row per step or per run of identical decode steps (``num_steps`` > 1).

    Each row tuple is packed by ``struct`` into one record of int64 counts and float64 times (one C call per row,
    ``itertools.starmap``: no interpreter per row), and the records are read as one structured array whose fields
    are the columns.  The values are the rows' own: the counts are Python ints (exact in int64), the times floats.
    (Before: a float64 matrix filled value by value with ``np.fromiter``, the counts cast back to int64, the same
    table; numpy converted each value through ``PyArray_Pack``, each int through a new float, ~300 instructions a
    value against ~130 packed: callgrind, 14,125 rows of 20 values, 88 -> 36 M instructions.)"""
    records = np.frombuffer(b"".join(starmap(_ROW.pack, rows)), dtype=_ROW_DTYPE)
    return pd.DataFrame({name: records[name] for name in STEP_COLUMNS})


class StepColumns:
    """The step table kept as columns, a chunk at a time: ``add`` is a ``step_sink`` of ``sim.runner.Simulation``
    (with ``record_steps=False``), and :meth:`table` equals :func:`step_table` of all the rows, dtypes and values.

    A row tuple of Python numbers costs ~500 bytes, a row of columns 160 (issue 34: a million requests of the
    incident made 1.2M rows, ~600 MB as tuples).  Each column is one array grown by half when full (the pages
    beyond the rows are never touched, so they cost no memory), and :meth:`table` takes views of the rows: the
    table is never copied whole."""

    GROWTH = 1.5

    def __init__(self) -> None:
        self._columns: dict[str, np.ndarray] = {}
        self.rows = 0

    def add(self, chunk: pd.DataFrame) -> None:
        """One chunk of the step table (``step_table`` of consecutive rows)."""
        n = len(chunk)
        if not n:
            return
        end = self.rows + n
        columns = self._columns
        if not columns or end > len(next(iter(columns.values()))):
            capacity = max(end, int(len(next(iter(columns.values()))) * self.GROWTH) if columns else 0)
            for name in STEP_COLUMNS:  # one column at a time: the old and new arrays of one column at once
                values = chunk[name].to_numpy()
                grown = np.empty(capacity, dtype=values.dtype)
                if name in columns:
                    grown[:self.rows] = columns[name][:self.rows]
                columns[name] = grown
        for name in STEP_COLUMNS:
            columns[name][self.rows:end] = chunk[name].to_numpy()
        self.rows = end

    def table(self) -> pd.DataFrame:
        """The rows added so far as one table (views of the columns, which it hands over: the columns are emptied,
        so the table's memory goes with the table)."""
        columns, rows = self._columns, self.rows
        self._columns, self.rows = {}, 0
        if not rows:
            return step_table([])
        return pd.DataFrame({name: columns[name][:rows] for name in STEP_COLUMNS}, copy=False)
