"""Raw file access shared by the readers: CSV (plain or gzip), parquet and JSON Lines, with line numbers.

Every reader reports errors as ``path:line``; the tables returned here carry a ``line`` array that maps each row
back to its physical line (header is line 1 for CSV; JSON Lines have no header, so the first record is line 1).
Parquet has no lines: ``line`` is ``None`` there and messages name the 1-based row instead.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import TraceError


@dataclass(frozen=True)
class RawTable:
    """A file's rows as strings or native values, and where each row came from."""

    path: str
    frame: pd.DataFrame
    lines: np.ndarray | None  # physical line of each row; None for parquet

    def where(self, row: int) -> tuple[int | None, str]:
        """(line for TraceError, extra text) for the row at position ``row``."""
        if self.lines is None:
            return None, f"row {row + 1}: "
        return int(self.lines[row]), ""


def kind_of(path: Path) -> str:
    """``csv``, ``parquet`` or ``jsonl`` from the file name (``.gz`` is looked through)."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    if name.endswith(".jsonl") or name.endswith(".json") or name.endswith(".ndjson"):
        return "jsonl"
    return "csv"


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def check_exists(path: Path) -> None:
    if not path.exists():
        raise TraceError(str(path), None, "no such file")
    if path.is_dir():
        raise TraceError(str(path), None, "is a directory, not a trace file")


def header_columns(path: Path) -> list[str]:
    """Column names of a CSV or parquet file, or the keys of a JSON Lines file's first record."""
    check_exists(path)
    kind = kind_of(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise TraceError(str(path), None, f"not a readable parquet file ({exc})") from None
    try:
        with _open_text(path) as fh:
            for number, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                if kind == "jsonl":
                    return list(_parse_json_line(str(path), number, text))
                header = pd.read_csv(io.StringIO(text.lstrip("\ufeff")), header=None, dtype=str)
                return [str(c).strip() for c in header.iloc[0]]
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise TraceError(str(path), None, f"cannot read: {exc}") from None
    raise TraceError(str(path), None, "empty file")


def jsonl_head(path: Path, limit: int) -> list[dict]:
    """Up to ``limit`` records from the start of a JSON Lines file; lines that are not JSON objects are passed
    over (the reader reports them with their line numbers)."""
    out: list[dict] = []
    try:
        with _open_text(path) as fh:
            for number, text in enumerate(fh, start=1):
                if len(out) >= limit:
                    break
                if not text.strip():
                    continue
                try:
                    out.append(_parse_json_line(str(path), number, text))
                except TraceError:
                    continue
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise TraceError(str(path), None, f"cannot read: {exc}") from None
    return out


def read_csv(path: Path) -> RawTable:
    """The whole CSV; blank lines are dropped but do not shift the line numbers of later rows."""
    check_exists(path)
    try:
        frame = pd.read_csv(path, skip_blank_lines=False, skipinitialspace=True, low_memory=False)
    except pd.errors.EmptyDataError:
        raise TraceError(str(path), None, "empty file") from None
    except pd.errors.ParserError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else None
        raise TraceError(str(path), line, f"cannot parse CSV row ({str(exc).strip()})") from None
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise TraceError(str(path), None, f"cannot read: {exc}") from None
    frame.columns = [str(c).lstrip("\ufeff").strip() for c in frame.columns]  # Excel-saved files start with a BOM
    lines = np.arange(len(frame)) + 2
    blank = frame.isna().all(axis=1).to_numpy()
    if blank.any():
        frame = frame.loc[~blank].reset_index(drop=True)
        lines = lines[~blank]
    return RawTable(str(path), frame, lines)


def read_parquet(path: Path) -> RawTable:
    check_exists(path)
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise TraceError(str(path), None, f"not a readable parquet file ({exc})") from None
    return RawTable(str(path), frame.reset_index(drop=True), None)


def _parse_json_line(path: str, number: int, text: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, number, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(path, number, f"expected a JSON object per line, got {type(record).__name__}")
    return record


def read_jsonl(path: Path) -> tuple[RawTable, list[tuple[int, str]]]:
    """Records of a JSON Lines file, and (line, reason) for lines that are not JSON objects."""
    check_exists(path)
    records: list[dict] = []
    lines: list[int] = []
    bad: list[tuple[int, str]] = []
    try:
        with _open_text(path) as fh:
            for number, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    records.append(_parse_json_line(str(path), number, text))
                except TraceError as exc:  # reported with the row checks, in line order
                    bad.append((number, str(exc)[len(f"{path}:{number}: "):]))
                    continue
                lines.append(number)
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise TraceError(str(path), None, f"cannot read: {exc}") from None
    if not records and not bad:
        raise TraceError(str(path), None, "empty file")
    if not records:
        raise TraceError(str(path), bad[0][0], f"{bad[0][1]} (no line of the file is a JSON object)")
    return RawTable(str(path), pd.DataFrame.from_records(records), np.asarray(lines, dtype=np.int64)), bad


def read_table(path: Path) -> tuple[RawTable, list[tuple[int, str]]]:
    """Any supported container, and (line, reason) for JSON lines that are not objects (always empty otherwise)."""
    kind = kind_of(path)
    if kind == "parquet":
        return read_parquet(path), []
    if kind == "jsonl":
        return read_jsonl(path)
    return read_csv(path), []
