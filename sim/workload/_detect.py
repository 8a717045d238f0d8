"""Which reader a file needs, from its header (CSV, parquet) or its first record's keys (JSON Lines).

Mooncake and vLLM timed-trace JSONL share their fields but not their time unit (ms vs s); guessing wrong
would scale the request rate 1000-fold, so a JSONL file is taken as Mooncake only when its name says so.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError, TraceError
from sim.workload._files import header_columns, kind_of
from sim.workload._readers import OUTPUT_ALIASES, PROMPT_ALIASES, READERS

FORMATS: tuple[str, ...] = tuple(READERS)


def check_format(fmt: str, field: str = "format") -> str:
    if fmt not in READERS:
        raise ConfigError(field, f"unknown trace format {fmt!r}; expected one of {list(FORMATS)}")
    return fmt


def detect_format(path: str | Path) -> str:
    """The format name of ``path``; TraceError naming the header when it matches none."""
    path = Path(path)
    columns = set(header_columns(path))
    kind = kind_of(path)
    if kind == "jsonl":
        if {"timestamp", "input_length", "output_length"} <= columns:
            if "mooncake" in path.name.lower():
                return "mooncake"
            raise TraceError(str(path), 1, "JSON Lines trace with timestamp/input_length/output_length: its time "
                             "unit is ambiguous; name the format: 'mooncake' (timestamp in ms) or 'timed-jsonl' "
                             "(seconds, vllm bench serve timed_trace)")
        if any(c in columns for c in PROMPT_ALIASES) and any(c in columns for c in OUTPUT_ALIASES):
            return "sharegpt"
    else:
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= columns:
            return "azure"
        if {"Timestamp", "Request tokens", "Response tokens"} <= columns:
            return "burstgpt"
        if {"arrival_s", "prompt_tokens", "output_tokens"} <= columns:
            return "normalized"
        if any(c in columns for c in PROMPT_ALIASES) and any(c in columns for c in OUTPUT_ALIASES):
            return "sharegpt"
    line = None if kind == "parquet" else 1
    raise TraceError(str(path), line, f"cannot tell the trace format from columns {sorted(columns)}; "
                     f"name it (one of {list(FORMATS)})")
