"""``summarize``: one typed record, a flat JSON-friendly dict with stable keys, and the CLI text table."""

import json
import math

import pytest

from objectives import Summary, format_summary, summarize
from sim.errors import ConfigError
from sim.workload.classes import SLO, RequestClass

CLASSES = {
    "chat": RequestClass("chat", SLO(ttft_p99_s=1.0, e2e_p99_s=10.0), timeout_s=30.0),
    "batch": RequestClass("batch"),
}


@pytest.fixture
def run(tables):
    r = tables.request
    reqs = tables.requests(
        r(cls="chat", ttft=0.2, end=2.0, generated=10, prompt=300),
        r("timed_out", cls="chat", arrival=1.0, end=30.0, generated=0, prompt=3000),
        r(cls="batch", arrival=2.0, ttft=1.0, end=9.0, generated=100, prompt=9000, preemptions=2, recomputed=9100),
        r("rejected", cls="batch", arrival=3.0, end=0.0, generated=0, prompt=200_000),
    )
    steps = tables.steps(tables.step(duration=1.0, new=9300), tables.step(duration=2.0, decode=110, num_steps=100),
                         tables.step(duration=1.0, recompute=9100))
    return reqs, steps


def test_summary_fields(run):
    s = summarize(*run, CLASSES)
    assert isinstance(s, Summary) and s.makespan_s == 31.0
    assert s.output_tokens_per_s == pytest.approx(110 / 31.0)
    assert s.goodput_rps == pytest.approx(2 / 31.0)
    assert s.classes["chat"].e2e_s.p99 == 30.0 and s.classes["batch"].e2e_s.p99 == math.inf
    assert s.steps.recompute_share == pytest.approx(9100 / (9300 + 110 + 9100))
    assert s.steps.new_token_busy_share == pytest.approx(3.0 / 4.0)
    assert s.classes["batch"].recomputed_tokens == 9100


def test_flat_dict_keys_and_json(run):
    d = summarize(*run, CLASSES).to_dict()
    for key in ("output_tokens_per_s", "goodput_rps", "makespan_s", "recompute_share", "new_token_busy_share",
                "kv_utilization", "swap_out_blocks", "preemptions_total", "preemptions_per_request.mean",
                "preemptions_per_request.p99", "preemptions_per_request.share_ge2", "all.e2e_s.p99",
                "class.chat.e2e_s.p99", "class.chat.ttft_s.p50", "class.batch.tpot_s.p90",
                "class.chat.count.timed_out", "class.chat.count.total", "class.batch.slo_attainment",
                "prompt.8192-inf.e2e_s.p99", "prompt.0-512.count.finished"):
        assert key in d, key
    assert d["class.chat.e2e_s.p99"] == 30.0 and d["class.chat.count.timed_out"] == 1
    assert d["prompt.8192-inf.count.total"] == 2
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d.values())
    assert json.loads(json.dumps(d)).keys() == d.keys()  # Python's json keeps inf/NaN as Infinity/NaN


def test_keys_do_not_depend_on_what_happened(run, tables):
    one = tables.requests(tables.request(cls="chat", ttft=0.1, end=1.0))
    assert summarize(one, None, CLASSES).to_dict().keys() == summarize(*run, CLASSES).to_dict().keys()


def test_format_summary_table(run):
    text = format_summary(summarize(*run, CLASSES))
    lines = text.splitlines()
    chat = next(line for line in lines if line.startswith("chat"))
    assert chat.split()[1:7] == ["2", "1", "1", "0", "0", "0"]  # total, fin, t/o, canc, rej, unf
    assert "30.00" in chat  # censored E2E p99
    batch = next(line for line in lines if line.startswith("batch"))
    assert "inf" in batch  # the rejected request never got an answer
    assert "prompt 8192-inf" in text and "prompt 1024-2048" not in text  # empty buckets hidden
    assert "recompute share 49.2%" in text and "busy GPU time on new tokens 75.0%" in text


def test_missing_columns_are_named(run):
    reqs, steps = run
    with pytest.raises(ConfigError, match="decode_tokens"):
        summarize(reqs, steps.drop(columns=["decode_tokens"]), CLASSES)
    with pytest.raises(ConfigError, match="end_s"):
        summarize(reqs.drop(columns=["end_s"]), steps, CLASSES)


def test_replay_table_without_step_table_and_unobservable_columns(run):
    reqs, _ = run
    reqs = reqs.assign(num_preemptions=math.nan, recomputed_tokens=math.nan)
    s = summarize(reqs, None, CLASSES)
    assert math.isnan(s.steps.recompute_share) and math.isnan(s.preemptions.mean)
    assert math.isnan(s.classes["chat"].recomputed_tokens)
    assert s.classes["chat"].e2e_s.p99 == 30.0  # what is observable still is
