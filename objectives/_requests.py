"""The request table's columns as numpy arrays, taken once per summary.

Every metric of ``summarize`` reads the same columns; converting them once (numbers to float64, the ``status``
and ``class`` labels factorized) lets the censoring, the SLO checks and every cohort work on plain arrays and
boolean masks instead of building pandas Series per step.  The values are those of ``_tables.column``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from objectives._tables import (
    FINISHED, REQUEST_COLUMNS, STATUSES, label_mask, labels, optional_values, require_columns, values,
)
from sim.errors import ConfigError
from sim.latency import PART_NAMES

#: Per-request stall columns summarized per cohort (request table, ``sim.tables``).
STALL_METRICS: tuple[str, ...] = ("max_itl_s", "preempted_s", "queue_wait_s", "resume_wait_s")
#: Busy-time parts the request table carries per request (``time_<part>_s``; transfer is apportioned by blocks).
REQUEST_PARTS: tuple[str, ...] = tuple(p for p in PART_NAMES if p != "transfer")


@dataclass(frozen=True)
class RequestArrays:
    """One array per column a metric reads, in row order (NaN where unknown)."""

    index: pd.Index
    #: Status label code per row, and the label of each code (``labels[code]``).
    status_codes: np.ndarray
    status_labels: tuple[str, ...]
    #: Class name code per row, and the name of each code.
    class_codes: np.ndarray
    class_labels: tuple[str, ...]
    arrival: np.ndarray
    first_token: np.ndarray
    end: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    prompt: np.ndarray
    generated: np.ndarray
    output_target: np.ndarray
    preemptions: np.ndarray
    recomputed: np.ndarray
    #: KV blocks moved over the host link (swapped or offloaded out, and back in).
    moved: np.ndarray
    #: ``STALL_METRICS`` columns; ``resume_wait_s`` only on preempted rows (NaN elsewhere).
    stalls: dict[str, np.ndarray]
    #: ``time_<part>_s`` per ``REQUEST_PARTS``.
    times: dict[str, np.ndarray]
    #: Finished at max_model_len before the output target (the simulator's ``capped`` column; None: unknown).
    capped: np.ndarray | None

    @classmethod
    def of(cls, requests: pd.DataFrame) -> "RequestArrays":
        """The arrays of ``requests``, checked as ``_tables.check_requests`` does (same errors, same order)."""
        require_columns(requests, REQUEST_COLUMNS, "requests")
        status_codes, status_labels = labels(requests, "status")
        unknown = sorted(set(status_labels) - set(STATUSES))
        if unknown:
            raise ConfigError("requests.status", f"unknown statuses {unknown}; known: {list(STATUSES)}")
        if requests["prompt_tokens"].isna().any():
            raise ConfigError("requests.prompt_tokens", "NaN prompt length: every request must have one")
        class_codes, class_labels = labels(requests, "class")
        preemptions = values(requests, "num_preemptions")
        stalls = {m: optional_values(requests, m) for m in STALL_METRICS}
        with np.errstate(invalid="ignore"):
            stalls["resume_wait_s"] = np.where(preemptions > 0, stalls["resume_wait_s"], np.nan)  # preempted only
        return cls(
            index=requests.index,
            status_codes=status_codes,
            status_labels=tuple(status_labels),
            class_codes=class_codes,
            class_labels=tuple(class_labels),
            arrival=values(requests, "arrival_s"),
            first_token=values(requests, "first_token_s"),
            end=values(requests, "end_s"),
            ttft=values(requests, "ttft_s"),
            tpot=values(requests, "tpot_s"),
            e2e=values(requests, "e2e_s"),
            prompt=values(requests, "prompt_tokens"),
            generated=values(requests, "generated_tokens"),
            output_target=optional_values(requests, "output_tokens_target"),
            preemptions=preemptions,
            recomputed=values(requests, "recomputed_tokens"),
            moved=optional_values(requests, "swapped_out_blocks") + optional_values(requests, "swapped_in_blocks"),
            stalls=stalls,
            times={p: optional_values(requests, f"time_{p}_s") for p in REQUEST_PARTS},
            capped=requests["capped"].to_numpy(dtype=bool) if "capped" in requests.columns else None,
        )

    def __len__(self) -> int:
        return len(self.status_codes)

    def status_is(self, *statuses: str) -> np.ndarray:
        """Boolean mask of the rows with one of ``statuses``."""
        return label_mask(self.status_codes, self.status_labels, statuses)

    def class_is(self, name: str) -> np.ndarray:
        """Boolean mask of the rows of class ``name``."""
        return label_mask(self.class_codes, self.class_labels, (name,))

    @property
    def finished(self) -> np.ndarray:
        return self.status_is(FINISHED)

