import pandas as pd
import pytest

from sim.errors import TraceError
from sim.workload import detect_format, load_trace

from .conftest import write

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_2023_raw_layout_matches_the_normalized_copy(data_dir):
    raw = data_dir / "AzureLLMInferenceTrace_conv_head.csv"
    assert detect_format(raw) == "azure"
    w = load_trace(raw)
    ref = pd.read_csv(data_dir / "azure_conv_2023_head.normalized.csv")
    assert len(w) == 40 and w.report.fmt == "azure"
    assert w.requests["arrival_s"].to_numpy() == pytest.approx(ref["arrival_s"].to_numpy(), abs=1e-6)
    assert w.requests["prompt_tokens"].tolist() == ref["prompt_tokens"].tolist()
    assert w.requests["output_tokens"].tolist() == ref["output_tokens"].tolist()
    assert set(w.requests["class"]) == {"default"}


def test_2024_layout_with_timezone_and_whole_seconds(data_dir):
    w = load_trace(data_dir / "AzureLLMInferenceTrace_code_1week_sample.csv")
    arrivals = w.requests["arrival_s"].tolist()
    assert len(w) == 25 and arrivals[0] == 0.0
    assert arrivals[1] == pytest.approx(0.410081, abs=1e-9)  # no float rounding from epoch seconds
    assert arrivals[5] == 3.0 and arrivals[6] == 3.0


def test_bad_timestamp_names_line(tmp_path):
    p = write(tmp_path, "a.csv", HEADER + "2023-11-16 18:15:46.6805900,374,44\nyesterday,396,109\n")
    with pytest.raises(TraceError, match=r"a.csv:3: TIMESTAMP='yesterday' is not a date-time"):
        load_trace(p)


def test_unsorted_timestamps_name_both_lines(tmp_path):
    p = write(tmp_path, "a.csv", HEADER + "2023-11-16 18:15:50.0,1,1\n2023-11-16 18:15:46.0,1,1\n")
    with pytest.raises(TraceError, match=r"a.csv:3: TIMESTAMP='2023-11-16 18:15:46.0' is earlier than "
                                         r"'2023-11-16 18:15:50.0' at line 2"):
        load_trace(p)


def test_negative_tokens(tmp_path):
    p = write(tmp_path, "a.csv", HEADER + "2023-11-16 18:15:50.0,1,1\n2023-11-16 18:15:51.0,-4,1\n")
    with pytest.raises(TraceError, match=r"a.csv:3: ContextTokens=-4 is negative"):
        load_trace(p, "azure")


def test_missing_column_when_named(tmp_path):
    p = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:50.0,1\n")
    with pytest.raises(TraceError, match=r"a.csv:1: missing column\(s\) \['GeneratedTokens'\] for format 'azure'"):
        load_trace(p, "azure")


def test_skip_bad_rows_rebases_on_first_good_row(tmp_path):
    p = write(tmp_path, "a.csv", HEADER + "nope,1,1\n2023-11-16 18:15:50.5,2,2\n2023-11-16 18:15:52.0,3,3\n")
    w = load_trace(p, skip_bad_rows=True)
    assert w.requests["arrival_s"].tolist() == [0.0, 1.5]
    assert w.report.bad_rows_skipped == 1
