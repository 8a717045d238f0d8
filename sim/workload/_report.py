"""What loading a trace changed: rows skipped, failed requests, rows that fell to the default class.

A trace that silently loses rows gives a study that silently answers a different question, so every row that
is dropped, re-classed or altered is counted here and attached to the workload (``Workload.report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class LoadReport:
    """Counts of what loading did to the trace's rows (all zero for a clean trace)."""

    source: str
    fmt: str
    rows_read: int = 0
    #: Malformed rows skipped under ``skip_bad_rows=True``; ``bad_row_examples`` holds the first few as
    #: ``path:line: reason``.
    bad_rows_skipped: int = 0
    bad_row_examples: tuple[str, ...] = ()
    #: Failed requests (BurstGPT: 0 response tokens) and what was done with them (``kept`` or ``dropped``).
    failed_requests: int = 0
    failed_policy: str = ""
    #: Rows that no class rule matched and that went to the default class.
    unmatched_rows: int = 0
    #: ``max_model_len``: outputs shortened so that prompt + output fits; prompts that alone do not fit
    #: (vLLM rejects them at the API) dropped.
    outputs_capped: int = 0
    prompts_too_long_dropped: int = 0
    notes: tuple[str, ...] = field(default=())

    def with_(self, **changes: object) -> "LoadReport":
        return replace(self, **changes)

    def summary(self) -> str:
        """One line for logs and the CLI; empty parts are left out."""
        parts = [f"{self.source} ({self.fmt}): {self.rows_read} rows read"]
        if self.bad_rows_skipped:
            parts.append(f"{self.bad_rows_skipped} malformed rows skipped (first: {self.bad_row_examples[0]})")
        if self.failed_requests:
            parts.append(f"{self.failed_requests} failed requests {self.failed_policy}")
        if self.unmatched_rows:
            parts.append(f"{self.unmatched_rows} rows matched no class rule (class 'default')")
        if self.outputs_capped:
            parts.append(f"{self.outputs_capped} outputs capped to max_model_len")
        if self.prompts_too_long_dropped:
            parts.append(f"{self.prompts_too_long_dropped} prompts longer than max_model_len dropped")
        parts.extend(self.notes)
        return "; ".join(parts)
