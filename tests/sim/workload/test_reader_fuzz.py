"""Fuzzed traces: whatever bytes a trace file holds, loading it gives a valid workload or one KvtuneError (the
CLI's one error line), never another exception.  Cells mix plausible values with hostile ones: huge and
fractional numbers, NaN/inf, quotes left open, separators, non-ASCII, hash lists with 1e400."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.errors import KvtuneError
from sim.workload import load_trace

CELLS = st.one_of(
    st.integers(min_value=-3, max_value=5000).map(str),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e12", "1e400", "99999999999999999999999", "0.5", "3.0",
                     '"', '"1,2"', "[1, 2]", "1 2 3", "[1e400]", "\x00", "é", "true", "NULL", ",", "\t"]),
    st.text(max_size=6),
)
COLUMNS = st.sampled_from(["arrival_s", "prompt_tokens", "output_tokens", "class", "hash_ids", "TIMESTAMP",
                           "ContextTokens", "GeneratedTokens", "Request tokens", "Response tokens", "Timestamp",
                           "extra"])


def _check(path, fmt=None):
    try:
        workload = load_trace(path, fmt)
    except KvtuneError as exc:
        assert str(exc).strip()  # a message to print as the one error line
        return
    requests = workload.requests
    assert len(requests) >= 1
    assert (requests["prompt_tokens"] >= 1).all() and (requests["output_tokens"] >= 1).all()
    assert np.isfinite(requests["arrival_s"].to_numpy(dtype=float)).all()
    assert (np.diff(requests["arrival_s"].to_numpy(dtype=float)) >= 0).all()


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.lists(COLUMNS, min_size=1, max_size=5),
       rows=st.lists(st.lists(CELLS, min_size=0, max_size=6), min_size=0, max_size=8))
def test_fuzzed_csv_is_a_workload_or_one_clean_error(tmp_path_factory, header, rows):
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_text(",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8",
                    errors="surrogatepass")
    _check(path)
    _check(path, "normalized")


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                        st.lists(st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats()), max_size=3))


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.dictionaries(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids",
                                                          "conversations", "x"]), JSON_VALUES, max_size=5),
                        max_size=6),
       raw=st.sampled_from(["", '{"timestamp": 1e400}', '{"hash_ids": [1e400]}', "{", "[1, 2]", "\x00"]))
def test_fuzzed_jsonl_is_a_workload_or_one_clean_error(tmp_path_factory, records, raw):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    lines = [json.dumps(r) for r in records] + ([raw] if raw else [])
    path.write_text("\n".join(lines) + "\n")
    for fmt in ("mooncake", "timed-jsonl", "sharegpt"):
        _check(path, fmt)
