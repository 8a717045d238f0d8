import gzip
import time

import numpy as np
import pandas as pd
import pytest

from sim.errors import TraceError
from sim.workload import ArrivalSpec, bundled_trace_path, detect_format, load_trace

from .conftest import write

HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def test_csv_sample_keeps_trace_class_as_class(data_dir):
    w = load_trace(data_dir / "azure_conv_2023_head.normalized.csv")
    assert len(w) == 40
    assert list(w.requests.columns[:5]) == ["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"]
    assert set(w.requests["class"]) == {"conv"} and set(w.classes) == {"conv"}
    assert w.requests["request_id"].tolist() == list(range(40))
    assert w.requests.loc[1, "arrival_s"] == pytest.approx(4.314579)
    assert (w.requests.loc[0, "prompt_tokens"], w.requests.loc[0, "output_tokens"]) == (374, 44)
    assert w.requests["prompt_tokens"].dtype == np.int64
    assert w.report.fmt == "normalized" and w.report.rows_read == 40 and w.report.bad_rows_skipped == 0


def test_class_column_wins_over_trace_class(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,class,trace_class\n"
              "0,10,5,chat,conv\n1,20,6,batch,conv\n2,30,7,,conv\n")
    w = load_trace(p)
    assert w.requests["class"].tolist() == ["chat", "batch", "default"]
    assert set(w.classes) == {"chat", "batch", "default"}
    assert w.report.unmatched_rows == 1


def test_no_class_columns_means_default(tmp_path):
    w = load_trace(write(tmp_path, "t.csv", HEADER + "0,10,5\n0.5,20,6\n"))
    assert set(w.requests["class"]) == {"default"} and set(w.classes) == {"default"}


def test_gzip_and_parquet_read_the_same(tmp_path, data_dir):
    src = data_dir / "azure_conv_2023_head.normalized.csv"
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    pq = tmp_path / "t.parquet"
    pd.read_csv(src).to_parquet(pq, index=False)
    base = load_trace(src).requests
    for path in (gz, pq):
        assert detect_format(path) == "normalized"
        pd.testing.assert_frame_equal(load_trace(path).requests, base, check_dtype=False)


def test_hash_ids_column_parsed_to_lists(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,hash_ids\n0,32,5,1 2\n1,16,5,[3]\n2,8,1,\n")
    assert load_trace(p).requests["hash_ids"].tolist() == [[1, 2], [3], []]


def test_bundled_trace_loads_fast():
    path = bundled_trace_path()
    assert path.name == "azure_conv_2023.csv.gz" and path.exists()
    load_trace(path)  # warm imports
    start = time.process_time()  # CPU time, not wall: other processes on a loaded machine do not count
    w = load_trace(path)
    elapsed = time.process_time() - start
    assert len(w) == 19366
    assert elapsed < 1.5, f"bundled trace took {elapsed:.3f} s of CPU"


@pytest.mark.parametrize("row, line, words", [
    ("1,-5,3", 3, "prompt_tokens=-5 is negative"),
    ("1,abc,3", 3, "prompt_tokens='abc' is not a number"),
    ("1,5,2.5", 3, "output_tokens=2.5 is not a whole number"),
    ("1,5,0", 3, "output_tokens=0 must be >= 1"),
    ("1,0,3", 3, "prompt_tokens=0 must be >= 1"),
    ("x,5,3", 3, "arrival_s='x' is not a number"),
    ("-1,5,3", 3, "arrival_s=-1 is negative"),
    (",5,3", 3, "arrival_s is missing"),
    ("1,5", 3, "output_tokens is missing"),
])
def test_malformed_row_names_file_and_line(tmp_path, row, line, words):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n" + row + "\n2,10,5\n")
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert err.value.path == str(p) and err.value.line == line
    assert str(err.value).startswith(f"{p}:{line}: ")
    assert words in str(err.value)


def test_unsorted_arrivals_are_an_error(tmp_path):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n5,10,5\n3,10,5\n6,10,5\n")
    with pytest.raises(TraceError, match=r"bad.csv:4: arrival_s=3 is earlier than 5 at line 3; timestamps must be sorted"):
        load_trace(p)


def test_one_error_counts_all_bad_rows(tmp_path):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n1,-1,5\n2,x,5\n3,10,5\n")
    with pytest.raises(TraceError, match=r":3: .*\(2 malformed rows in all"):
        load_trace(p)


def test_skip_bad_rows_skips_and_reports(tmp_path):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n1,-1,5\n2,x,5\n3,10,5\n1,10,5\n4,10,5\n")
    w = load_trace(p, skip_bad_rows=True)
    assert w.requests["arrival_s"].tolist() == [0, 3, 4]
    assert w.report.rows_read == 6 and w.report.bad_rows_skipped == 3
    assert w.report.bad_row_examples[0].startswith(f"{p}:3: prompt_tokens=-1")
    assert "3 malformed rows skipped" in w.report.summary()


def test_missing_column_is_one_error(tmp_path):
    p = write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,tokens_out\n0,1,2\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_trace(p)
    with pytest.raises(TraceError, match=r"bad.csv:1: missing column\(s\) \['output_tokens'\]"):
        load_trace(p, "normalized")


def test_ragged_row_names_its_line(tmp_path):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n1,10,5,7\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: cannot parse CSV row"):
        load_trace(p)


def test_blank_lines_do_not_shift_line_numbers(tmp_path):
    p = write(tmp_path, "bad.csv", HEADER + "0,10,5\n\n1,-3,5\n")
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert err.value.line == 4


def test_partly_empty_arrivals_are_bad_rows_but_all_empty_means_untimed(tmp_path):
    with pytest.raises(TraceError, match=":3: arrival_s is missing"):
        load_trace(write(tmp_path, "a.csv", HEADER + "0,10,5\n,10,5\n"))
    untimed = write(tmp_path, "b.csv", HEADER + ",10,5\n,11,5\n")
    with pytest.raises(TraceError, match="has no arrival times"):
        load_trace(untimed)
    w = load_trace(untimed, arrival=ArrivalSpec("poisson", rate_rps=2.0))
    assert w.requests["prompt_tokens"].tolist() == [10, 11]


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="empty file"):
        load_trace(write(tmp_path, "e.csv", ""), "normalized")
    with pytest.raises(TraceError, match="no requests left"):
        load_trace(write(tmp_path, "h.csv", HEADER))


def test_parquet_errors_name_the_row(tmp_path):
    p = tmp_path / "t.parquet"
    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [5, -1], "output_tokens": [1, 1]}).to_parquet(p)
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert err.value.line is None and str(err.value).startswith(f"{p}: row 2: prompt_tokens=-1 is negative")


def test_byte_order_mark_in_header(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n".encode())
    assert detect_format(p) == "azure" and len(load_trace(p)) == 1
