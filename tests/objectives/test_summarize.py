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
    steps = tables.steps(tables.step(duration=1.0, new=9300, parts={"prefill_new": 0.9, "overhead": 0.1}),
                         tables.step(duration=2.0, decode=110, num_steps=100, parts={"decode": 1.8, "overhead": 0.2}),
                         tables.step(duration=1.0, recompute=9100, parts={"recompute": 0.9, "overhead": 0.1}))
    return reqs, steps


def test_summary_fields(run):
    s = summarize(*run, CLASSES)
    assert isinstance(s, Summary) and s.makespan_s == 31.0
    assert s.output_tokens_per_s == pytest.approx(110 / 31.0)
    assert s.goodput_rps == pytest.approx(2 / 31.0)
    assert s.classes["chat"].e2e_s.p99 == 30.0 and s.classes["batch"].e2e_s.p99 == math.inf
    assert s.steps.recompute_token_share == pytest.approx(9100 / (9300 + 110 + 9100))
    assert s.steps.new_token_busy_share == pytest.approx(2.7 / 4.0)
    assert s.steps.recompute_busy_share == pytest.approx(0.9 / 4.0)
    assert s.classes["batch"].recomputed_tokens == 9100


def test_flat_dict_keys_and_json(run):
    d = summarize(*run, CLASSES).to_dict()
    for key in ("output_tokens_per_s", "goodput_rps", "makespan_s", "recompute_token_share", "new_token_busy_share",
                "recompute_busy_share", "new_token_token_share", "time.recompute_s", "time.busy_s", "itl_s_p99",
                "busy_fraction", "class.chat.e2e_s.censored_share", "class.chat.e2e_s.attainment",
                "class.chat.max_itl_s.p99", "all.preempted_s.max", "all.queue_wait_s.p99", "all.resume_wait_s.p99",
                "class.batch.time.decode_s", "class.batch.new_token_busy_share", "output.0-256.count.total",
                "preempted.0.count.total", "preempted.2.e2e_s.p99", "preempted.5+.count.total",
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
    assert "recompute 22.5%" in text and "new-token busy share 67.5%" in text  # by time
    assert "recompute 49.2%" in text  # the token share, named as such
    assert "preempted 2" in text and "output 0-256" in text


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
    assert math.isnan(s.steps.recompute_token_share) and math.isnan(s.preemptions.mean)
    assert all(c.counts.total == 0 for c in s.preemption_buckets.values())  # no preemption counts: no cohort
    assert math.isnan(s.classes["chat"].recomputed_tokens)
    assert s.classes["chat"].e2e_s.p99 == 30.0  # what is observable still is


def test_censored_share_beside_every_tail_and_no_tpot_for_lost_requests(tables):
    """2% lost and 55% lost give the same p99 (the timeout); the censored share and attainment tell them apart."""
    classes = {"chat": RequestClass("chat", SLO(e2e_p99_s=10.0, tpot_p99_s=0.1), timeout_s=120.0)}
    r = tables.request

    def run(lost: int):
        rows = [r(cls="chat", ttft=0.5, end=5.0, generated=50) for _ in range(100 - lost)]
        rows += [r("timed_out", cls="chat", end=120.0, generated=0) for _ in range(lost)]
        return summarize(tables.requests(*rows), None, classes).classes["chat"]

    few, many = run(2), run(55)
    assert few.e2e_s.p99 == many.e2e_s.p99 == 120.0
    assert few.e2e_s.censored_share == pytest.approx(0.02) and many.e2e_s.censored_share == pytest.approx(0.55)
    assert few.e2e_s.attainment == pytest.approx(0.98) and many.e2e_s.attainment == pytest.approx(0.45)
    assert few.slo_attainment == pytest.approx(0.98)
    assert many.tpot_s.p99 == pytest.approx(4.5 / 49)  # lost requests have no TPOT, not 120 s
    assert many.tpot_s.censored_share == pytest.approx(0.55)
    assert many.tpot_s.attainment == pytest.approx(0.45)  # but they miss the TPOT target


def test_cohorts_by_output_length_and_preemption_count(tables):
    r = tables.request
    rows = [r(ttft=0.1, end=2.0, generated=100) for _ in range(20)]
    rows += [r(ttft=0.1, end=50.0, generated=5000, preemptions=3) for _ in range(3)]
    s = summarize(tables.requests(*rows), None, {"default": RequestClass("default")})
    assert s.output_buckets["0-256"].counts.total == 20 and s.output_buckets["4096-16384"].counts.total == 3
    assert s.output_buckets["4096-16384"].e2e_s.p99 == 50.0 and s.output_buckets["0-256"].e2e_s.p99 == 2.0
    assert s.preemption_buckets["0"].counts.total == 20 and s.preemption_buckets["3-4"].counts.total == 3
    assert list(s.preemption_buckets) == ["0", "1", "2", "3-4", "5+"]
