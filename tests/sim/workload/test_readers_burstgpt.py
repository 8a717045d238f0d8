import pytest

from sim.errors import ConfigError, TraceError
from sim.workload import ClassRules, detect_format, load_trace

from .conftest import write

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_failed_requests_kept_as_their_own_class_and_counted(data_dir):
    p = data_dir / "BurstGPT_sample.csv"
    assert detect_format(p) == "burstgpt"
    w = load_trace(p)
    df = w.requests
    assert len(w) == 12 and w.report.failed_requests == 3
    assert "3 failed requests kept as class 'failed'" in w.report.summary()
    failed = df[df["class"] == "failed"]
    assert failed["arrival_s"].tolist() == [115.0, 116.0, 155.0]  # relative to the first request (t=5)
    assert (failed["output_tokens"] == 1).all()
    assert set(w.classes) == {"default", "failed"}
    assert {"Model", "Log Type"} <= set(df.columns)


def test_failed_requests_dropped_only_on_request_and_counted(data_dir):
    w = load_trace(data_dir / "BurstGPT_sample.csv", failed_requests="drop")
    assert len(w) == 9 and w.report.failed_requests == 3 and "dropped" in w.report.failed_policy
    assert (w.requests["output_tokens"] >= 1).all()
    with pytest.raises(ConfigError, match="failed_requests"):
        load_trace(data_dir / "BurstGPT_sample.csv", failed_requests="ignore")


def test_class_rules_on_model_and_log_type(data_dir):
    rules = ClassRules.from_dict({
        "broken": {"match": {"trace_class": "failed"}},
        "gpt4": {"match": {"Model": "GPT-4"}, "slo": {"ttft_p99_s": 5}},
        "api": {"match": {"log_type": "API log"}, "priority": 1},
    })
    w = load_trace(data_dir / "BurstGPT_sample.csv", classes=rules)
    counts = w.requests["class"].value_counts().to_dict()
    assert counts == {"broken": 3, "gpt4": 3, "api": 2, "default": 4}
    assert w.report.unmatched_rows == 4
    assert w.classes["gpt4"].slo.ttft_p99_s == 5 and w.classes["api"].priority == 1


@pytest.mark.parametrize("row, words", [
    ("7,ChatGPT,-3,5,2,API log", "Request tokens=-3 is negative"),
    ("7,ChatGPT,3,-5,2,API log", "Response tokens=-5 is negative"),
    ("7,ChatGPT,3,many,2,API log", "Response tokens='many' is not a number"),
    ("1,ChatGPT,3,5,8,API log", "Timestamp=1 is earlier than 5 at line 2"),
    ("7,ChatGPT,0,5,5,API log", "Request tokens=0 must be >= 1"),
])
def test_malformed_rows(tmp_path, row, words):
    p = write(tmp_path, "b.csv", HEADER + "5,ChatGPT,10,20,30,API log\n" + row + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert err.value.line == 3 and words in str(err.value)


def test_burstgpt3_extra_columns_kept(tmp_path):
    p = write(tmp_path, "b3.csv", "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
              "Total tokens,Log Type\n0,abc,1.5,ChatGPT,10,20,30,Conversation log\n2,abc,0.8,ChatGPT,15,0,15,"
              "Conversation log\n")
    w = load_trace(p)
    assert w.requests["Session ID"].tolist() == ["abc", "abc"] and w.report.failed_requests == 1
