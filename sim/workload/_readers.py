"""One reader per trace format; each turns a file into the normalized columns plus the trace's own extras.

Output columns: ``arrival_s`` (float seconds, NaN everywhere for untimed length files), ``prompt_tokens``,
``output_tokens`` (int64), optional ``hash_ids`` (list of ints), and the format's descriptive columns kept under
their own names (``trace_class``, ``class``, ``Model``, ``Log Type``, ...) so class rules can match on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from sim.errors import ConfigError, TraceError, short_repr
from sim.workload._files import RawTable, read_table
from sim.workload._report import LoadReport
from sim.workload._validate import MAX_TOKENS, RowChecks, check_sorted, numeric_column, require_columns

FAILED_POLICIES = ("keep", "drop")
FAILED_CLASS = "failed"


@dataclass(frozen=True)
class ParsedTrace:
    """A trace's rows in normalized columns; ``timed`` is False for length-only files (ShareGPT style)."""

    frame: pd.DataFrame
    timed: bool
    report: LoadReport


@dataclass(frozen=True)
class ReadOptions:
    skip_bad_rows: bool = False
    failed_requests: str = "keep"  # BurstGPT rows with 0 response tokens: keep as class "failed", or drop


_OUTPUT_REASON = "must be >= 1 (0 output tokens usually marks a failed request)"


def _tokens(checks: RowChecks, prompt: str, output: str, *, output_minimum: int = 1) -> tuple[np.ndarray, np.ndarray]:
    p = numeric_column(checks, prompt, integer=True, minimum=1, maximum=MAX_TOKENS,
                       minimum_reason="must be >= 1 (a request has at least one prompt token)")
    o = numeric_column(checks, output, integer=True, minimum=output_minimum, minimum_reason=_OUTPUT_REASON,
                       maximum=MAX_TOKENS)
    return p, o


_SPLIT = re.compile(r"[\s,;]+")


def _int64_lists(values: list) -> bool:
    """Every value a list of Python ints within int64: what the row-by-row check below passes unchanged, checked in
    one pass over the flattened ints (a quarter of its time on a 20,000-row Mooncake trace)."""
    if set(map(type, values)) != {list}:
        return False
    flat = list(chain.from_iterable(values))
    return set(map(type, flat)) <= {int} and (not flat or (-2**63 <= min(flat) and max(flat) < 2**63))


def _hash_ids(checks: RowChecks, column: str) -> list | None:
    """Block hashes per row as lists of ints; accepts lists (JSON, parquet) or ``"1 2 3"`` / ``"[1, 2]"`` strings."""
    if column not in checks.table.frame.columns:
        return None
    raw = checks.table.frame[column].tolist()
    if _int64_lists(raw):  # the usual case (JSON Lines lists of integers): all good, the same lists
        return raw
    out: list = []
    bad = np.zeros(len(raw), dtype=bool)
    for i, value in enumerate(raw):
        try:
            if isinstance(value, str):
                text = value.strip().strip("[]").strip()
                ids = [int(t) for t in _SPLIT.split(text) if t] if text else []
            elif value is None or (isinstance(value, float) and np.isnan(value)):
                ids = []
            else:
                ids = [int(v) for v in value]
                if any(not float(v).is_integer() for v in value if not isinstance(v, (int, np.integer))):
                    raise ValueError(value)
            if any(not -2**63 <= v < 2**63 for v in ids):  # they are int64 keys from here on
                raise ValueError(value)
        except (TypeError, ValueError, OverflowError):
            bad[i] = True
            ids = []
        out.append(ids)
    checks.add(bad, lambda i: f"{column}={short_repr(raw[i])} is not a list of 64-bit integers")
    return out


def _finish(table: RawTable, checks: RowChecks, fmt: str, columns: dict[str, object], opts: ReadOptions,
            *, timed: bool, extras: list[str], drop: np.ndarray | None = None, **report: object) -> ParsedTrace:
    """Drop bad rows (or raise on the first), and build the normalized frame and its report.

    ``drop``: rows removed on purpose (not malformed), counted by the caller in ``report``.
    """
    keep, skipped, examples = checks.finish(opts.skip_bad_rows)
    if drop is not None:
        keep = keep & ~drop
    data: dict[str, object] = {}
    for name, values in columns.items():
        if isinstance(values, list):
            data[name] = [v for v, k in zip(values, keep) if k]
        else:
            data[name] = np.asarray(values)[keep]
    frame = pd.DataFrame(data)
    for name in ("prompt_tokens", "output_tokens"):
        frame[name] = frame[name].astype(np.int64)
    for name in extras:
        if name in table.frame.columns and name not in frame.columns:
            frame[name] = table.frame[name].to_numpy()[keep]
    rep = LoadReport(source=table.path, fmt=fmt, rows_read=checks.rows_read,
                     bad_rows_skipped=skipped, bad_row_examples=examples, **report)  # type: ignore[arg-type]
    return ParsedTrace(frame.reset_index(drop=True), timed, rep)


def _rebased(values: np.ndarray) -> np.ndarray:
    finite = values[np.isfinite(values)]
    return values - finite[0] if len(finite) else values


def read_normalized(path: Path, opts: ReadOptions) -> ParsedTrace:
    """kvtune's own CSV/parquet: ``arrival_s,prompt_tokens,output_tokens[,class][,trace_class][,hash_ids]...``.

    An ``arrival_s`` column that is empty on every row means the file has lengths only (then an arrival process
    must be given); partly empty is an error.
    """
    table, unparsed = read_table(path)
    require_columns(table, ["arrival_s", "prompt_tokens", "output_tokens"], "normalized")
    checks = RowChecks(table)
    checks.add_unparsed(unparsed)
    raw_arrival = table.frame["arrival_s"]
    timed = not bool(raw_arrival.isna().all())
    if timed:
        arrival = numeric_column(checks, "arrival_s", integer=False, minimum=0.0)
        check_sorted(checks, arrival, "arrival_s")
    else:
        arrival = np.full(len(table.frame), np.nan)
    prompt, output = _tokens(checks, "prompt_tokens", "output_tokens")
    columns: dict[str, object] = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output}
    hashes = _hash_ids(checks, "hash_ids")
    if hashes is not None:
        columns["hash_ids"] = hashes
    known = {"arrival_s", "prompt_tokens", "output_tokens", "hash_ids", "request_id"}
    extras = [c for c in table.frame.columns if c not in known]
    return _finish(table, checks, "normalized", columns, opts, timed=timed, extras=extras)


def read_azure(path: Path, opts: ReadOptions) -> ParsedTrace:
    """Azure LLM inference trace 2023/2024: absolute ``TIMESTAMP`` made relative to the first request."""
    table, unparsed = read_table(path)
    require_columns(table, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], "azure")
    checks = RowChecks(table)
    checks.add_unparsed(unparsed)
    raw = table.frame["TIMESTAMP"]
    text = raw.astype("string").str.strip()
    missing = (raw.isna() | (text == "")).to_numpy(dtype=bool, na_value=True)
    stamps = pd.to_datetime(text.where(~missing), format="ISO8601", errors="coerce", utc=True)
    nat = stamps.isna().to_numpy() & ~missing
    checks.add(missing, lambda i: "TIMESTAMP is missing")
    checks.add(nat, lambda i: f"TIMESTAMP={raw.iloc[i]!r} is not a date-time")
    ns = stamps.to_numpy(dtype="datetime64[ns]").astype("int64")
    valid = ~stamps.isna().to_numpy()
    first = ns[valid][0] if valid.any() else 0  # subtract in integers: epoch seconds as floats lose microseconds
    seconds = np.where(valid, (ns - first).astype(np.float64) / 1e9, np.nan)
    check_sorted(checks, seconds, "TIMESTAMP")
    prompt, output = _tokens(checks, "ContextTokens", "GeneratedTokens")
    columns = {"arrival_s": _rebased(np.where(checks.bad_mask(), np.nan, seconds)),
               "prompt_tokens": prompt, "output_tokens": output}
    return _finish(table, checks, "azure", columns, opts, timed=True, extras=[])


def read_burstgpt(path: Path, opts: ReadOptions) -> ParsedTrace:
    """BurstGPT: ``Timestamp`` in seconds; rows with 0 response tokens are failed requests.

    Failed requests are never silently kept or dropped: by default they are kept as class ``failed`` (trace_class)
    with one output token (they still arrived and took a prefill slot); ``failed_requests="drop"`` removes them.
    Both are counted in the report. ``Model`` and ``Log Type`` stay as columns for class rules.
    """
    if opts.failed_requests not in FAILED_POLICIES:
        raise ConfigError("failed_requests", f"must be one of {list(FAILED_POLICIES)}, got {opts.failed_requests!r}")
    table, unparsed = read_table(path)
    require_columns(table, ["Timestamp", "Request tokens", "Response tokens"], "burstgpt")
    checks = RowChecks(table)
    checks.add_unparsed(unparsed)
    stamps = numeric_column(checks, "Timestamp", integer=False, minimum=0.0)
    check_sorted(checks, stamps, "Timestamp")
    prompt, output = _tokens(checks, "Request tokens", "Response tokens", output_minimum=0)
    failed = (output == 0) & ~checks.bad_mask()
    n_failed = int(failed.sum())
    drop = opts.failed_requests == "drop"
    policy = "dropped (failed_requests='drop')" if drop else f"kept as class '{FAILED_CLASS}' with 1 output token"
    columns = {"arrival_s": _rebased(np.where(checks.bad_mask(), np.nan, stamps)), "prompt_tokens": prompt,
               "output_tokens": np.where(failed, 1, output), "trace_class": np.where(failed, FAILED_CLASS, "default")}
    return _finish(table, checks, "burstgpt", columns, opts, timed=True,
                   extras=["Model", "Log Type", "Session ID", "Elapsed time", "Total tokens"],
                   drop=failed if drop else None, failed_requests=n_failed, failed_policy=policy if n_failed else "")


def _read_timed_jsonl(path: Path, opts: ReadOptions, fmt: str, seconds_per_unit: float) -> ParsedTrace:
    table, unparsed = read_table(path)
    require_columns(table, ["timestamp", "input_length", "output_length"], fmt)
    checks = RowChecks(table)
    checks.add_unparsed(unparsed)
    stamps = numeric_column(checks, "timestamp", integer=False, minimum=0.0)
    check_sorted(checks, stamps, "timestamp")
    prompt, output = _tokens(checks, "input_length", "output_length")
    columns: dict[str, object] = {"arrival_s": _rebased(stamps * seconds_per_unit),
                                  "prompt_tokens": prompt, "output_tokens": output}
    hashes = _hash_ids(checks, "hash_ids")
    if hashes is not None:
        columns["hash_ids"] = hashes
    known = {"timestamp", "input_length", "output_length", "hash_ids"}
    extras = [c for c in table.frame.columns if c not in known]
    return _finish(table, checks, fmt, columns, opts, timed=True, extras=extras)


def read_mooncake(path: Path, opts: ReadOptions) -> ParsedTrace:
    """Mooncake (FAST'25) JSONL: ``timestamp`` in milliseconds; ``hash_ids`` kept for the prefix cache."""
    return _read_timed_jsonl(path, opts, "mooncake", 1e-3)


def read_timed_jsonl(path: Path, opts: ReadOptions) -> ParsedTrace:
    """``vllm bench serve --dataset-name timed_trace`` JSONL: Mooncake's fields with ``timestamp`` in seconds
    (vLLM's default ``--timed-trace-sec-multiplier 1``)."""
    return _read_timed_jsonl(path, opts, "timed-jsonl", 1.0)


#: Length-file column names seen in the wild, first match wins.
PROMPT_ALIASES = ("prompt_tokens", "input_length", "input_len", "prompt_len", "num_prefill_tokens", "input_tokens")
OUTPUT_ALIASES = ("output_tokens", "output_length", "output_len", "completion_len", "num_decode_tokens",
                  "completion_tokens")


def read_sharegpt(path: Path, opts: ReadOptions) -> ParsedTrace:
    """Length-only files (ShareGPT token counts): no arrival times, so the caller must give an arrival process."""
    table, unparsed = read_table(path)
    cols = set(table.frame.columns)
    prompt_col = next((c for c in PROMPT_ALIASES if c in cols), None)
    output_col = next((c for c in OUTPUT_ALIASES if c in cols), None)
    if prompt_col is None or output_col is None:
        raise TraceError(table.path, 1 if table.lines is not None else None,
                         f"format 'sharegpt' needs a prompt length column (one of {list(PROMPT_ALIASES)}) and an "
                         f"output length column (one of {list(OUTPUT_ALIASES)}); found {sorted(map(str, cols))}")
    checks = RowChecks(table)
    checks.add_unparsed(unparsed)
    prompt, output = _tokens(checks, prompt_col, output_col)
    columns = {"arrival_s": np.full(len(table.frame), np.nan), "prompt_tokens": prompt, "output_tokens": output}
    known = {prompt_col, output_col, "arrival_s"}
    extras = [c for c in table.frame.columns if c not in known]
    return _finish(table, checks, "sharegpt", columns, opts, timed=False, extras=extras)


READERS: dict[str, Callable[[Path, ReadOptions], ParsedTrace]] = {
    "normalized": read_normalized,
    "azure": read_azure,
    "burstgpt": read_burstgpt,
    "mooncake": read_mooncake,
    "timed-jsonl": read_timed_jsonl,
    "sharegpt": read_sharegpt,
}
