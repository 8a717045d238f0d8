"""Column names of the request and step tables (docs/design.md, 'Data contracts') and the checks metrics rely on.

Only the columns a metric reads are required; a column the replay backend cannot observe is present but NaN,
and the metrics that need it come out NaN (never invented).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from sim.errors import ConfigError

FINISHED = "finished"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
REJECTED = "rejected"
UNFINISHED = "unfinished"
#: Every request status, in the order reports list them.
STATUSES: tuple[str, ...] = (FINISHED, TIMED_OUT, CANCELLED, REJECTED, UNFINISHED)

#: Request-table columns the metrics read.
REQUEST_COLUMNS: tuple[str, ...] = (
    "class", "arrival_s", "prompt_tokens", "generated_tokens", "status", "first_token_s", "end_s",
    "ttft_s", "tpot_s", "e2e_s", "num_preemptions", "recomputed_tokens",
)
#: Step-table columns the metrics read (``start_s`` is optional: it only extends the observation window).
STEP_COLUMNS: tuple[str, ...] = (
    "num_steps", "duration_s", "prefill_tokens_new", "prefill_tokens_recompute", "decode_tokens",
    "kv_blocks_used", "kv_blocks_total", "swap_out_blocks", "swap_in_blocks",
)


def require_columns(table: pd.DataFrame, columns: Iterable[str], name: str) -> None:
    """Raise ``ConfigError`` naming every missing column: a missing column is a producer bug, not a NaN."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ConfigError(name, f"missing columns {missing} (see docs/design.md, 'Data contracts')")


def check_requests(requests: pd.DataFrame) -> None:
    """Check the request table: the columns, known statuses, and a prompt length on every row."""
    require_columns(requests, REQUEST_COLUMNS, "requests")
    unknown = sorted(set(requests["status"].astype(str)) - set(STATUSES))
    if unknown:
        raise ConfigError("requests.status", f"unknown statuses {unknown}; known: {list(STATUSES)}")
    if requests["prompt_tokens"].isna().any():
        raise ConfigError("requests.prompt_tokens", "NaN prompt length: every request must have one")


def column(table: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column as float64 (NaN where unknown), so sums and comparisons never see object dtypes."""
    return pd.to_numeric(table[name], errors="coerce").astype("float64")


def optional_column(table: pd.DataFrame, name: str) -> pd.Series:
    """:func:`column`, or all NaN when the table has no such column (a producer that cannot observe it)."""
    if name not in table.columns:
        return pd.Series(float("nan"), index=table.index, dtype="float64")
    return column(table, name)


def values(table: pd.DataFrame, name: str) -> np.ndarray:
    """:func:`column` as a numpy array (float64, NaN where unknown); a numpy-typed numeric column is converted
    directly, anything else (strings, nullable or object columns) goes through :func:`column`."""
    series = table[name]
    if isinstance(series.dtype, np.dtype) and series.dtype.kind in "biuf":
        return series.to_numpy(dtype="float64")
    return column(table, name).to_numpy()


def optional_values(table: pd.DataFrame, name: str) -> np.ndarray:
    """:func:`values`, or all NaN when the table has no such column."""
    if name not in table.columns:
        return np.full(len(table), np.nan)
    return values(table, name)


def labels(table: pd.DataFrame, name: str) -> tuple[np.ndarray, list]:
    """A label column (``status``, ``class``) as strings, factorized once: (code per row, the distinct labels);
    ``labels[code]`` is the row's ``table[name].astype(str)`` value (a missing one is a label too)."""
    codes, uniques = pd.factorize(table[name].astype(str), use_na_sentinel=False)
    return codes, list(uniques)


def label_mask(codes: np.ndarray, names: Iterable, wanted: Iterable[str]) -> np.ndarray:
    """Boolean mask of the rows whose label (``names[code]``, as :func:`labels` gives them) is one of ``wanted``."""
    wanted = set(wanted)
    hit = np.array([name in wanted for name in names], dtype=bool)
    return hit[codes] if hit.size else np.zeros(len(codes), dtype=bool)
