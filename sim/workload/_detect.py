"""Which reader a file needs, from its header (CSV, parquet) or its first record's keys (JSON Lines).

Mooncake and vLLM timed-trace JSONL share their fields but not their time unit (ms vs s); guessing wrong
would scale the request rate 1000-fold.  A JSONL file is taken as Mooncake when its name says so, or when its
content has Mooncake's published form (FAST'25 traces, kvcache-ai/Mooncake ``FAST25-release/traces``): every one
of its first ``CONTENT_RECORDS`` records has exactly the keys ``timestamp``, ``input_length``, ``output_length`` and
``hash_ids``, with a whole-number (JSON integer) ``timestamp`` and a list of integers for ``hash_ids``.  Anything
else with those time fields (fractional timestamps as ``vllm bench serve``'s timed_trace examples write them, a
record without ``hash_ids``, extra keys as in Alibaba's Qwen traces, which are in seconds) stays ambiguous: the
one-line error asks for the format.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError, TraceError
from sim.workload._files import header_columns, jsonl_head, kind_of
from sim.workload._readers import OUTPUT_ALIASES, PROMPT_ALIASES, READERS

FORMATS: tuple[str, ...] = tuple(READERS)
#: Mooncake's record keys (FAST'25 traces): what content detection requires, no more and no less.
MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
#: Records read from the start of an unnamed JSONL file to decide whether it is Mooncake's.
CONTENT_RECORDS = 1000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def looks_like_mooncake(path: Path, limit: int = CONTENT_RECORDS) -> bool:
    """Whether the first ``limit`` records of ``path`` (lines that are not JSON objects passed over) all have
    Mooncake's form: exactly its four keys, an integer (millisecond) ``timestamp``, a list of integer ``hash_ids``."""
    records = jsonl_head(path, limit)
    return bool(records) and all(
        set(r) == MOONCAKE_KEYS and _is_int(r["timestamp"]) and isinstance(r["hash_ids"], list)
        and all(_is_int(h) for h in r["hash_ids"])
        for r in records
    )


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
            if "mooncake" in path.name.lower() or looks_like_mooncake(path):
                return "mooncake"
            raise TraceError(str(path), 1, "JSON Lines trace with timestamp/input_length/output_length: its time "
                             "unit is ambiguous (not in Mooncake's form: integer timestamp and hash_ids, no other "
                             "keys); name the format: 'mooncake' (timestamp in ms) or 'timed-jsonl' "
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
