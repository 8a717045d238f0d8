import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import TraceError
from sim.workload import _readers, detect_format, load_trace

from .conftest import write


def test_mooncake_ms_to_seconds_and_hash_ids_lists(data_dir):
    p = data_dir / "mooncake_trace_sample.jsonl"
    assert detect_format(p) == "mooncake"
    df = load_trace(p).requests
    assert df["arrival_s"].tolist() == pytest.approx([0, 0, 10.535, 27.482, 30.110, 41.002])
    assert df.loc[0, "hash_ids"] == list(range(14)) and df.loc[1, "hash_ids"] == [46, 47]
    assert df["prompt_tokens"].tolist()[:2] == [6758, 655]


def test_timed_trace_in_seconds(data_dir):
    p = data_dir / "timed_trace_sample.jsonl"
    with pytest.raises(TraceError, match="time unit is ambiguous"):
        detect_format(p)
    df = load_trace(p, "timed-jsonl").requests
    assert df["arrival_s"].tolist() == [0.0, 0.35, 1.2, 2.75]
    assert df["hash_ids"].tolist()[2] == []  # no hash_ids on that line: no shared prefix


def _lines(*records):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


GOOD = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}


@pytest.mark.parametrize("bad, words", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object per line"),
    ({"timestamp": 5, "input_length": -1, "output_length": 5}, "input_length=-1 is negative"),
    ({"timestamp": 5, "output_length": 5}, "input_length is missing"),
    ({"timestamp": 5, "input_length": 3, "output_length": "x"}, "output_length='x' is not a number"),
    ({"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": "a b"}, "hash_ids='a b' is not a list"),
    ({"timestamp": -5, "input_length": 3, "output_length": 2}, "timestamp=-5 is negative"),
])
def test_malformed_lines_name_the_line(tmp_path, bad, words):
    p = write(tmp_path, "mooncake.jsonl", _lines(GOOD, {**GOOD, "timestamp": 3}, bad))
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert err.value.line == 3 and words in str(err.value)


def test_unsorted_and_skip(tmp_path):
    p = write(tmp_path, "mooncake.jsonl", _lines(GOOD, {**GOOD, "timestamp": 900}, "", {**GOOD, "timestamp": 100},
                                                  "{oops", {**GOOD, "timestamp": 1000}))
    with pytest.raises(TraceError, match=r":4: timestamp=100 is earlier than 900 at line 2"):
        load_trace(p)
    w = load_trace(p, skip_bad_rows=True)
    assert w.requests["arrival_s"].tolist() == [0.0, 0.9, 1.0]
    assert w.report.bad_rows_skipped == 2 and w.report.rows_read == 5
    assert any(":5: not valid JSON" in e for e in w.report.bad_row_examples)


def test_gzipped_jsonl(tmp_path, data_dir):
    import gzip

    p = tmp_path / "mooncake_trace.jsonl.gz"
    p.write_bytes(gzip.compress((data_dir / "mooncake_trace_sample.jsonl").read_bytes()))
    assert len(load_trace(p)) == 6


# ---- a Mooncake file whose name does not say so: detected by content (issue 32) ------------------------------
def test_mooncake_detected_by_content_when_the_name_does_not_say(tmp_path, data_dir):
    sample = data_dir / "mooncake_trace_sample.jsonl"
    p = write(tmp_path, "conversation_trace.jsonl", sample.read_text())
    assert detect_format(p) == "mooncake"
    named, unnamed = load_trace(sample).requests, load_trace(p).requests
    assert unnamed["arrival_s"].tolist() == named["arrival_s"].tolist()  # milliseconds, as the named file
    assert unnamed["hash_ids"].tolist() == named["hash_ids"].tolist()


def test_mooncake_content_detection_looks_through_gzip_and_bad_lines(tmp_path, data_dir):
    import gzip

    p = tmp_path / "toolagent.jsonl.gz"
    p.write_bytes(gzip.compress((data_dir / "mooncake_trace_sample.jsonl").read_bytes()))
    assert detect_format(p) == "mooncake"
    q = write(tmp_path, "trace.jsonl", _lines(GOOD, "{oops", {**GOOD, "timestamp": 3}))
    assert detect_format(q) == "mooncake"  # the bad line is the reader's to report, with its number
    with pytest.raises(TraceError, match=r":2: not valid JSON"):
        load_trace(q)


@pytest.mark.parametrize("second", [
    {**GOOD, "timestamp": 0.35},                        # fractional: seconds, as vllm's timed_trace examples
    {**GOOD, "timestamp": 3.0},                         # a JSON float, not Mooncake's integer milliseconds
    {"timestamp": 3, "input_length": 10, "output_length": 5},   # no hash_ids
    {**GOOD, "timestamp": 3, "chat_id": 7, "turn": 1},  # extra keys (Alibaba Qwen traces are in seconds)
    {**GOOD, "timestamp": 3, "hash_ids": [1.5]},        # hash ids that are not integers
    {**GOOD, "timestamp": 3, "hash_ids": "1 2"},
])
def test_jsonl_not_in_mooncake_form_stays_ambiguous(tmp_path, second):
    p = write(tmp_path, "trace.jsonl", _lines(GOOD, second))
    with pytest.raises(TraceError, match="time unit is ambiguous") as err:
        detect_format(p)
    assert err.value.line == 1 and "\n" not in str(err.value)


def test_ambiguous_jsonl_is_a_one_line_exit_2(tmp_path, capsys, data_dir):
    from optimizer.cli import main

    p = write(tmp_path, "trace.jsonl", (data_dir / "timed_trace_sample.jsonl").read_text())
    assert main(["workload", "describe", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "time unit is ambiguous" in err
    good = write(tmp_path, "conversation.jsonl", (data_dir / "mooncake_trace_sample.jsonl").read_text())
    assert main(["workload", "describe", str(good)]) == 0
    assert "(mooncake)" in capsys.readouterr().out


# ---- hash_ids checked in one pass give what the row-by-row check gives (issue 34: start-up cost) -----------------
_IDS = st.one_of(st.integers(min_value=-2**64, max_value=2**64), st.booleans(), st.floats(allow_nan=False),
                 st.integers(min_value=0, max_value=9))
_HASHES = st.one_of(st.lists(_IDS, max_size=4), st.lists(st.integers(-3, 2**63 - 1), max_size=4), st.none(),
                    st.sampled_from(["1 2", "[3, 4]", "", "x"]))


def _read(path, *, row_by_row: bool):
    with pytest.MonkeyPatch.context() as m:
        if row_by_row:
            m.setattr(_readers, "_int64_lists", lambda values: False)
        try:
            w = load_trace(path, "mooncake", skip_bad_rows=True)
        except TraceError as exc:
            return str(exc)
        return w.requests.to_dict("list"), w.report


@settings(max_examples=60, deadline=None)
@given(hashes=st.lists(_HASHES, min_size=1, max_size=5))
def test_hash_ids_checked_in_one_pass_are_the_row_by_row_result(tmp_path_factory, hashes):
    records = [{"timestamp": i, "input_length": 10, "output_length": 5, **({} if h is None else {"hash_ids": h})}
               for i, h in enumerate(hashes)]
    p = write(tmp_path_factory.mktemp("h"), "mooncake.jsonl", _lines(*records))
    assert _read(p, row_by_row=False) == _read(p, row_by_row=True)

