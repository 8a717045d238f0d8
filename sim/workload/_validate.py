"""Vectorized row validation: check whole columns at once, then name the first bad line.

Checking 19k rows one by one in Python is slow; pandas checks them in a few milliseconds, and only the rows that
fail are looked at individually to write the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from sim.errors import TraceError
from sim.workload._files import RawTable

_EXAMPLES = 3


def show(value: object) -> str:
    """A cell as the user wrote it: strings quoted, numbers plain (no ``np.int64(...)``)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


@dataclass
class RowChecks:
    """Problems found per row; ``finish`` raises on the first one or, when skipping, drops and counts them."""

    table: RawTable
    _checks: list[tuple[np.ndarray, Callable[[int], str]]] = field(default_factory=list)
    _unparsed: list[tuple[int, str]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.table.frame)

    @property
    def rows_read(self) -> int:
        return self.n + len(self._unparsed)

    def add(self, mask: np.ndarray | pd.Series, reason: Callable[[int], str]) -> None:
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self._checks.append((mask, reason))

    def add_unparsed(self, items: list[tuple[int, str]]) -> None:
        """Lines the file reader could not parse at all (JSON Lines): not in the table, but bad rows all the same."""
        self._unparsed.extend(items)

    def bad_mask(self) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        for m, _ in self._checks:
            mask |= m
        return mask

    def _describe(self, row: int) -> str:
        for m, reason in self._checks:
            if m[row]:
                line, prefix = self.table.where(row)
                where = f"{self.table.path}:{line}" if line is not None else self.table.path
                return f"{where}: {prefix}{reason(row)}"
        raise AssertionError("row has no problem")

    def finish(self, skip_bad_rows: bool) -> tuple[np.ndarray, int, tuple[str, ...]]:
        """(rows to keep, number skipped, examples); raises TraceError at the first bad row unless skipping."""
        bad = self.bad_mask()
        count = int(bad.sum()) + len(self._unparsed)
        if not count:
            return ~bad, 0, ()
        bad_rows = np.flatnonzero(bad)
        if not skip_bad_rows:
            more = f" ({count} malformed rows in all; fix them, or load with skip_bad_rows=True to skip and count them)"
            first_unparsed = min(self._unparsed, default=None)
            if len(bad_rows):
                row = int(bad_rows[0])
                line, prefix = self.table.where(row)
                if first_unparsed is None or line is None or line < first_unparsed[0]:
                    reason = next(r(row) for m, r in self._checks if m[row])
                    raise TraceError(self.table.path, line, prefix + reason + more)
            assert first_unparsed is not None
            raise TraceError(self.table.path, first_unparsed[0], first_unparsed[1] + more)
        examples = [f"{self.table.path}:{line}: {why}" for line, why in self._unparsed]
        examples += [self._describe(int(r)) for r in bad_rows[:_EXAMPLES]]
        return ~bad, count, tuple(examples[:_EXAMPLES])


def require_columns(table: RawTable, columns: list[str], fmt: str) -> None:
    missing = [c for c in columns if c not in table.frame.columns]
    if missing:
        have = ", ".join(map(str, table.frame.columns)) or "none"
        raise TraceError(table.path, 1 if table.lines is not None else None,
                         f"missing column(s) {missing} for format '{fmt}' (columns found: {have})")


#: Token counts beyond this are refused (no model has such a context; int64 arithmetic would overflow).
MAX_TOKENS = 10**8


def numeric_column(checks: RowChecks, column: str, *, integer: bool, minimum: float | None,
                   label: str | None = None, minimum_reason: str = "", maximum: float | None = None) -> np.ndarray:
    """``column`` as float64 (NaN where bad); missing, non-numeric, fractional or too-small values are flagged."""
    label = label or column
    raw = checks.table.frame[column]
    if raw.dtype == object or pd.api.types.is_string_dtype(raw.dtype):
        stripped = raw.astype("string").str.strip()
        missing = (raw.isna() | (stripped == "")).to_numpy(dtype=bool, na_value=True)
        values = pd.to_numeric(stripped.where(~missing), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    elif pd.api.types.is_bool_dtype(raw.dtype):
        missing = np.zeros(len(raw), dtype=bool)
        values = np.full(len(raw), np.nan)
    else:
        missing = raw.isna().to_numpy(dtype=bool)
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    checks.add(missing, lambda i: f"{label} is missing")
    not_number = ~missing & ~np.isfinite(values)
    checks.add(not_number, lambda i: f"{label}={show(raw.iloc[i])} is not a number")
    ok = np.isfinite(values)
    if integer:
        fractional = ok & (values != np.floor(np.where(ok, values, 0)))
        checks.add(fractional, lambda i: f"{label}={show(raw.iloc[i])} is not a whole number of tokens")
        ok &= ~fractional
    if minimum is not None:
        low = ok & (values < minimum)
        why = minimum_reason or (f"must be >= {minimum:g}")
        checks.add(low, lambda i: f"{label}={values[i]:g} {'is negative' if values[i] < 0 else why}")
        ok &= ~low
    if maximum is not None:
        high = ok & (values > maximum)
        checks.add(high, lambda i: f"{label}={show(raw.iloc[i])} is out of range (at most {maximum:g})")
        ok &= ~high
    return np.where(ok, values, np.nan)


def check_sorted(checks: RowChecks, times: np.ndarray, label: str) -> None:
    """Flag rows whose time is earlier than an earlier row's: arrival order is the trace's meaning."""
    valid = np.isfinite(times) & ~checks.bad_mask()
    filled = np.where(valid, times, -np.inf)
    running = np.maximum.accumulate(filled)
    previous = np.concatenate(([-np.inf], running[:-1]))
    early = valid & (filled < previous)
    if not early.any():
        return
    positions = np.arange(len(filled))
    holder = np.maximum.accumulate(np.where(valid & (filled >= running), positions, 0))
    holder_before = np.concatenate(([0], holder[:-1]))
    raw = checks.table.frame[label]

    def reason(i: int) -> str:
        j = int(holder_before[i])
        line, _ = checks.table.where(j)
        at = f"line {line}" if line is not None else f"row {j + 1}"
        return f"{label}={show(raw.iloc[i])} is earlier than {show(raw.iloc[j])} at {at}; timestamps must be sorted"

    checks.add(early, reason)
