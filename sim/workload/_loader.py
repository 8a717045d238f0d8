"""``load_trace``: any supported trace file -> a Workload with classes, arrivals and a load report."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import ConfigError, TraceError
from sim.workload._arrivals import ArrivalSpec, arrival_times
from sim.workload._detect import check_format, detect_format
from sim.workload._readers import READERS, ParsedTrace, ReadOptions
from sim.workload._report import LoadReport
from sim.workload._rules import ClassRules, auto_classes
from sim.workload.workload import WORKLOAD_COLUMNS, Workload

log = logging.getLogger("kvtune.workload")

_BUNDLED = "azure_conv_2023.csv.gz"


def bundled_trace_path() -> Path:
    """The Azure LLM inference 2023 conversation trace shipped with kvtune (normalized CSV, 19,366 requests)."""
    return Path(str(resources.files("sim").joinpath("data", _BUNDLED)))


def _trace_rate(arrivals: np.ndarray) -> float | None:
    if len(arrivals) < 2:
        return None
    span = float(arrivals[-1] - arrivals[0])
    return (len(arrivals) - 1) / span if span > 0 else None


def read_rows(path: Path, fmt: str | None, *, skip_bad_rows: bool = False,
              failed_requests: str = "keep") -> ParsedTrace:
    """The trace's rows in normalized columns, before classes and arrivals; TraceError when none are left."""
    fmt = check_format(fmt) if fmt is not None else detect_format(path)
    parsed = READERS[fmt](path, ReadOptions(skip_bad_rows=skip_bad_rows, failed_requests=failed_requests))
    if len(parsed.frame) == 0:
        raise TraceError(str(path), None, "no requests left to load" +
                         (f" ({parsed.report.summary()})" if parsed.report.rows_read else ""))
    return parsed


def load_trace(path: str | Path, fmt: str | None = None, *, classes: ClassRules | None = None,
               arrival: ArrivalSpec | None = None, skip_bad_rows: bool = False, seed: int = 0,
               failed_requests: str = "keep", hash_block_tokens: int | None = None) -> Workload:
    """Read a trace file into a Workload.

    ``fmt``: ``normalized|azure|burstgpt|mooncake|timed-jsonl|sharegpt``, detected from the header when ``None``.
    ``classes``: rules that assign classes and their SLOs; without them the ``class`` column, else
    ``trace_class``, else everything is ``default``. ``arrival``: replaces the trace's timestamps (``poisson`` /
    ``gamma``; rate defaults to the trace's own) or keeps them (``replay``); required for length-only files.
    ``skip_bad_rows``: skip malformed rows and count them in ``Workload.report`` instead of raising TraceError.
    ``failed_requests``: BurstGPT failed requests are kept as class ``failed`` (``keep``) or dropped (``drop``),
    counted either way. ``seed``: for generated arrivals. ``hash_block_tokens``: prompt tokens per ``hash_ids``
    entry (default Mooncake's 512; see :class:`~sim.workload.workload.Workload`).
    """
    parsed = read_rows(Path(path), fmt, skip_bad_rows=skip_bad_rows, failed_requests=failed_requests)
    workload = from_rows(parsed, classes=classes, arrival=arrival, seed=seed)
    return workload if hash_block_tokens is None else workload.with_hash_block_tokens(hash_block_tokens)


def from_rows(parsed: ParsedTrace, *, classes: ClassRules | None, arrival: ArrivalSpec | None,
              seed: int) -> Workload:
    """A Workload from rows read by ``read_rows``: arrivals (required for length-only traces), then classes."""
    frame, report = parsed.frame.copy(), parsed.report
    path = report.source
    if not parsed.timed and (arrival is None or arrival.process == "replay"):
        raise TraceError(str(path), None, "has no arrival times (length-only trace); give an arrival process with "
                         "a rate, e.g. arrival: {process: poisson, rate_rps: 5}")
    if arrival is not None and arrival.process != "replay":
        rate = _trace_rate(frame["arrival_s"].to_numpy()) if parsed.timed else None
        if arrival.rate_rps is None and rate is None:
            raise ConfigError("arrival.rate_rps", f"is required: {path} has no request rate of its own to keep")
        frame["arrival_s"] = arrival_times(arrival, np.random.default_rng(seed), rate_rps=rate, n=len(frame))
        report = report.with_(notes=report.notes + (f"arrivals regenerated ({arrival.process})",))
    return assemble(frame, classes, str(path), report)


def assemble(frame: pd.DataFrame, classes: ClassRules | None, source: str, report: LoadReport) -> Workload:
    """Classes, request ids and column order for rows in normalized columns (sorted by arrival)."""
    frame = frame.copy()
    if classes is not None:
        names, unmatched = classes.assign(frame)
        class_table = classes.classes()
        if not unmatched and classes.default.name not in set(names):
            class_table.pop(classes.default.name)
    else:
        names, class_table, unmatched = auto_classes(frame)
    report = report.with_(unmatched_rows=unmatched)
    if classes is not None and "class" in frame.columns and "trace_class" not in frame.columns:
        frame = frame.rename(columns={"class": "trace_class"})  # keep the trace's own label for later rules
    frame["request_id"] = np.arange(len(frame), dtype=np.int64)
    frame["class"] = pd.array(names, dtype=object)
    ordered = list(WORKLOAD_COLUMNS) + [c for c in frame.columns if c not in WORKLOAD_COLUMNS]
    frame = frame[ordered]
    if report.bad_rows_skipped or report.failed_requests or report.unmatched_rows:
        log.warning("%s", report.summary())
    return Workload(requests=frame.reset_index(drop=True), classes=class_table, source=source, report=report)
