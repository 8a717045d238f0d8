"""``summarize`` equals a plain re-statement of the metric definitions (objectives/README.md, the module docstrings).

The reference below works row by row in Python for the censoring and the SLO checks, and per cohort with pandas
masks and ``np.percentile(method="higher")`` (the percentile rule's definition), sharing no code with
``objectives`` beyond the dataclass field names.  Random request tables cover every status, several classes (one
never used), empty buckets, NaN first-token times and columns, zero-length outputs and optional columns left out.
Busy-time parts are multiples of 1/8 so their sums are exact in any order; every other float is compared bit
for bit (NaN where NaN).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objectives import percentiles, summarize
from objectives._percentile import SortedColumn, sorted_percentiles
from sim.workload.classes import SLO, RequestClass

NAN = math.nan
STATUSES = ("finished", "timed_out", "cancelled", "rejected", "unfinished")
PARTS = ("prefill_new", "recompute", "decode", "transfer", "overhead")
STALLS = ("max_itl_s", "preempted_s", "queue_wait_s", "resume_wait_s")
CLASSES = {
    "a": RequestClass("a", SLO(ttft_p99_s=1.0, tpot_p99_s=0.25, e2e_p99_s=8.0), timeout_s=30.0),
    "b": RequestClass("b"),  # no targets, no timeout
    "c": RequestClass("c", SLO(e2e_p99_s=4.0)),  # a target, no timeout
    "idle": RequestClass("idle", timeout_s=5.0),  # no request: an empty cohort
}
PROMPT_EDGES = (0, 512, 1024, 2048, 4096, 8192, math.inf)
OUTPUT_EDGES = (0, 256, 1024, 4096, 16384, math.inf)
PREEMPTED = (("0", 0, 1), ("1", 1, 2), ("2", 2, 3), ("3-4", 3, 5), ("5+", 5, math.inf))

# ---------------------------------------------------------------------------------------------------- tables

times = st.one_of(st.sampled_from([0.0, 0.25, 1.0, 2.0, 7.5]), st.floats(0, 200, allow_nan=False))
maybe_time = st.one_of(st.just(NAN), times)
counts = st.one_of(st.integers(0, 3), st.integers(0, 30))
sizes = st.sampled_from([0, 1, 255, 256, 511, 512, 1023, 1024, 3000, 4096, 8191, 8192, 16384, 40_000])
dyadic = st.integers(0, 64).map(lambda k: k / 8)


@st.composite
def request_rows(draw):
    n = draw(st.integers(0, 40))
    arrival = [draw(st.one_of(times, st.just(NAN))) if draw(st.integers(0, 15)) == 0 else draw(times)
               for _ in range(n)]
    rows = {
        "request_id": list(range(n)),
        "class": [draw(st.sampled_from(["a", "b", "c"])) for _ in range(n)],
        "status": [draw(st.sampled_from(STATUSES)) for _ in range(n)],
        "arrival_s": arrival,
        "prompt_tokens": [draw(sizes) for _ in range(n)],
        "generated_tokens": [draw(st.one_of(st.sampled_from([0, 1, 2]), counts, st.just(NAN))) for _ in range(n)],
        "first_token_s": [a + draw(maybe_time) for a in arrival],
        "end_s": [a + draw(maybe_time) for a in arrival],
        "ttft_s": [draw(maybe_time) for _ in range(n)],
        "e2e_s": [draw(maybe_time) for _ in range(n)],
        "tpot_s": [draw(st.one_of(st.just(NAN), st.floats(0, 1, allow_nan=False))) for _ in range(n)],
        "num_preemptions": [draw(st.integers(0, 6)) for _ in range(n)],
        "recomputed_tokens": [draw(counts) for _ in range(n)],
    }
    if draw(st.booleans()):  # replay-like: preemption columns unknown
        rows["num_preemptions"] = [NAN] * n
        rows["recomputed_tokens"] = [NAN] * n
    optional = {
        "output_tokens_target": lambda: draw(st.one_of(sizes, st.just(NAN))),
        "swapped_out_blocks": lambda: draw(st.sampled_from([0, 0, 0, 1, 3])),
        "swapped_in_blocks": lambda: draw(st.sampled_from([0, 0, 2])),
        "capped": lambda: draw(st.booleans()),
        **{m: (lambda: draw(maybe_time)) for m in STALLS},
        **{f"time_{p}_s": (lambda: draw(st.one_of(dyadic, dyadic, st.just(NAN)))) for p in PARTS if p != "transfer"},
    }
    for name, value in optional.items():
        if draw(st.integers(0, 5)):  # mostly present
            rows[name] = [value() for _ in range(n)]
    df = pd.DataFrame(rows)
    if draw(st.booleans()):
        df["class"] = df["class"].astype("category")
    return df


@st.composite
def step_tables(draw):
    if draw(st.booleans()):
        return None
    n = draw(st.integers(1, 3))
    rows = [{"step": i, "num_steps": 1, "start_s": draw(dyadic), "duration_s": draw(dyadic), "prefill_tokens_new": 1,
             "prefill_tokens_recompute": 0, "decode_tokens": 1, "kv_blocks_used": 1, "kv_blocks_total": 10,
             "swap_out_blocks": 0, "swap_in_blocks": 0, **{f"time_{p}_s": draw(dyadic) for p in PARTS}}
            for i in range(n)]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------- reference


def _known(values):
    return [v for v in values if not math.isnan(v)]


def _pct(values) -> list[float]:
    """The percentile rule's definition: numpy's "higher" method; NaN if empty or any value unknown."""
    values = list(values)
    if not values or any(math.isnan(v) for v in values):
        return [NAN] * 3
    return [float(v) for v in np.percentile(np.array(values, dtype=float), [50, 90, 99], method="higher")]


def _total(values) -> float:
    out = 0.0
    for v in values:
        out += v  # NaN propagates; exact for the integer and 1/8-multiple columns of these tables
    return out


def _share(flags) -> float:
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags) if flags else NAN


def _fmax(a: float, b: float) -> float:
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def _per_row(df: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Censored latencies and SLO checks of every request (objectives/_censor.py, _throughput.py docstrings)."""
    ends = _known(df["end_s"]) + _known(df["arrival_s"])
    if steps is not None:
        ends += _known(steps["start_s"] + steps["duration_s"])
    obs_end = max(ends) if ends else NAN
    out = []
    for r in df.to_dict("records"):
        cls = CLASSES[str(r["class"])]
        timeout = NAN if cls.timeout_s is None else cls.timeout_s
        status, gen = r["status"], r["generated_tokens"]
        finished = status == "finished"
        waited = (r["end_s"] if not math.isnan(r["end_s"]) else obs_end) - r["arrival_s"]
        if status in ("cancelled", "unfinished"):
            lost = waited if not math.isnan(waited) else timeout
        elif status == "timed_out":
            lost = _fmax(waited, timeout)
        elif status == "rejected":
            lost = _fmax(waited, timeout) if not math.isnan(timeout) else math.inf
        else:
            lost = NAN
        if not finished and math.isnan(lost):
            lost = math.inf
        ttft = r["ttft_s"] if not math.isnan(r["ttft_s"]) else r["first_token_s"] - r["arrival_s"]
        ttft_censored = not (finished or not math.isnan(ttft) or gen >= 1)
        tpot = r["tpot_s"]
        if math.isnan(tpot) and not finished and gen >= 2:
            tpot = (r["end_s"] - r["first_token_s"]) / (gen - 1)
        no_second = gen < 2 or (not finished and math.isnan(gen) and math.isnan(tpot))
        row = {
            "ttft_s": lost if ttft_censored else ttft,
            "e2e_s": r["e2e_s"] if finished else lost,
            "tpot_s": NAN if no_second else tpot,
            "applicable": not no_second, "ttft_censored": ttft_censored, "finished": finished,
        }
        targets = cls.slo.targets()
        missed = unknown = False
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            target = targets.get(metric)
            value = row[metric] if metric != "tpot_s" or row["applicable"] else -math.inf
            if target is None:
                row[f"check_{metric}"] = NAN
            elif not finished:
                row[f"check_{metric}"] = 0.0
            elif math.isnan(value):
                row[f"check_{metric}"] = NAN
                unknown = True
            else:
                row[f"check_{metric}"] = 0.0 if value > target else 1.0
                missed |= value > target
        row["met"] = 0.0 if not finished or missed else NAN if unknown else 1.0
        out.append(row)
    return pd.DataFrame(out, index=df.index, columns=[
        "ttft_s", "e2e_s", "tpot_s", "applicable", "ttft_censored", "finished",
        "check_ttft_s", "check_tpot_s", "check_e2e_s", "met"])


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name].astype(float) if name in df.columns else pd.Series(NAN, index=df.index)


def _cohort(prefix: str, df: pd.DataFrame, rows: pd.DataFrame, mask: pd.Series, span: float,
            per_block: float) -> dict:
    sub, r = df[mask], rows[mask]
    n = len(sub)
    out = {f"{prefix}.count.{s}": int((sub["status"] == s).sum()) for s in STATUSES}
    capped = (sub["capped"].astype(bool) & r["finished"]) if "capped" in sub.columns else pd.Series(False)
    out[f"{prefix}.count.capped"] = int(capped.sum())
    out[f"{prefix}.count.total"] = n
    censored = {"ttft_s": r["ttft_censored"], "tpot_s": ~r["applicable"] & ~r["finished"], "e2e_s": ~r["finished"]}
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        values = r.loc[r["applicable"], metric] if metric == "tpot_s" else r[metric]
        judged = _known(r[f"check_{metric}"])
        for q, v in zip(("p50", "p90", "p99"), _pct(values)):
            out[f"{prefix}.{metric}.{q}"] = v
        out[f"{prefix}.{metric}.censored_share"] = _share(censored[metric])
        out[f"{prefix}.{metric}.attainment"] = sum(judged) / len(judged) if judged else NAN
    preempted = _col(sub, "num_preemptions") > 0
    for stall in STALLS:
        values = _col(sub, stall)
        values = _known(values[preempted] if stall == "resume_wait_s" else values)
        for q, v in zip(("p50", "p90", "p99", "max"), [*_pct(values), max(values)] if values else [NAN] * 4):
            out[f"{prefix}.{stall}.{q}"] = v
    output = _total(_col(sub, "generated_tokens")[r["finished"]])
    good = _total(r["met"])
    per_s = 1.0 / span if span > 0 else NAN
    out[f"{prefix}.output_tokens"] = output
    out[f"{prefix}.output_tokens_per_s"] = output * per_s
    out[f"{prefix}.goodput_rps"] = good * per_s
    out[f"{prefix}.slo_attainment"] = good / n if n else NAN
    out[f"{prefix}.recomputed_tokens"] = _total(_col(sub, "recomputed_tokens"))
    out[f"{prefix}.preemptions_per_request.mean"] = _total(_col(sub, "num_preemptions")) / n if n else NAN
    moved = _total(_col(sub, "swapped_out_blocks") + _col(sub, "swapped_in_blocks"))
    time = {p: _total(_col(sub, f"time_{p}_s")) for p in PARTS if p != "transfer"}
    time["transfer"] = 0.0 if moved == 0 else moved * per_block
    busy = sum(time[p] for p in PARTS)
    out.update({f"{prefix}.time.{p}_s": time[p] for p in PARTS})
    out[f"{prefix}.time.busy_s"] = busy
    out[f"{prefix}.new_token_busy_share"] = (time["prefill_new"] + time["decode"]) / busy if busy > 0 else NAN
    out[f"{prefix}.recompute_busy_share"] = time["recompute"] / busy if busy > 0 else NAN
    return out


def _label(lo: float, hi: float) -> str:
    return f"{lo:g}-{'inf' if hi == math.inf else f'{hi:g}'}"


def reference(df: pd.DataFrame, steps: pd.DataFrame | None) -> dict:
    """Every key of ``summarize(...).to_dict()`` but the step-table ones, in its order."""
    rows = _per_row(df, steps)
    ends, arrivals = _known(df["end_s"]), _known(df["arrival_s"])
    span = max(ends) - min(arrivals) if ends and arrivals else NAN
    span = span if span > 0 else NAN
    run_transfer = _total(steps["time_transfer_s"]) if steps is not None else NAN
    moved = _total(_col(df, "swapped_out_blocks") + _col(df, "swapped_in_blocks"))
    per_block = 0.0 if moved == 0 else run_transfer / moved
    everyone = pd.Series(True, index=df.index)
    overall = _cohort("all", df, rows, everyone, span, per_block)
    out = {"makespan_s": span,
           "output_tokens_per_s": _total(df["generated_tokens"][rows["finished"]]) / span if span > 0 else NAN,
           "goodput_rps": overall["all.goodput_rps"]}
    pre = df["num_preemptions"].astype(float)
    known = bool(len(pre)) and not pre.isna().any()
    out["preemptions_total"] = _total(pre) if known else NAN
    stats = ([_total(pre) / len(pre), *_pct(pre), float(pre.max()), _share(pre >= 1), _share(pre >= 2)]
             if known else [NAN] * 7)
    out.update({f"preemptions_per_request.{k}": v
                for k, v in zip(("mean", "p50", "p90", "p99", "max", "share_ge1", "share_ge2"), stats)})
    out.update(overall)
    for name in CLASSES:
        out.update(_cohort(f"class.{name}", df, rows, df["class"].astype(str) == name, span, per_block))
    groups = (("prompt", df["prompt_tokens"].astype(float), PROMPT_EDGES),
              ("output", _col(df, "output_tokens_target"), OUTPUT_EDGES))
    for group, values, edges in groups:
        for lo, hi in zip(edges, edges[1:]):
            out.update(_cohort(f"{group}.{_label(lo, hi)}", df, rows, (values >= lo) & (values < hi), span,
                               per_block))
    for label, lo, hi in PREEMPTED:
        out.update(_cohort(f"preempted.{label}", df, rows, (pre >= lo) & (pre < hi), span, per_block))
    return out


# ------------------------------------------------------------------------------------------------------ tests


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_rows(), step_tables())
def test_summarize_equals_the_definitions(df, steps):
    got = summarize(df, steps, CLASSES).to_dict()
    want = reference(df, steps)
    assert [k for k in got if k in want] == list(want)  # same keys, same order
    wrong = {k: (got[k], v) for k, v in want.items() if not _same(got[k], v)}
    assert not wrong


def test_reference_covers_the_cohort_keys(tables):
    reqs = tables.requests(tables.request(cls="a", ttft=0.1, end=1.0))
    got, want = summarize(reqs, None, CLASSES).to_dict(), reference(reqs, None)
    rest = [k for k in got if k not in want]  # only the step-table figures come from elsewhere
    assert rest and all(k.startswith("time.") or "." not in k for k in rest)


@given(st.lists(st.one_of(st.floats(0, 100, allow_nan=False), st.just(math.inf), st.just(NAN),
                          st.sampled_from([0.0, 1.0, 2.0])), max_size=80), st.data())
def test_sorted_column_subsets_give_the_percentiles_of_the_subset(values, data):
    values = np.array(values, dtype=float)
    column = SortedColumn(values)
    for _ in range(3):
        rows = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))), dtype=bool)
        got, want = sorted_percentiles(column.of(rows)), percentiles(values[rows])
        assert all(_same(g, w) for g, w in zip(got, want))


def test_sorted_index_is_numpys_for_every_size():
    for n in [*range(1, 3000), 9_999, 10_001, 123_457, 1_000_001]:
        ranks = np.arange(n, dtype=float)
        assert sorted_percentiles(ranks) == tuple(np.percentile(ranks, [50, 90, 99], method="higher")), n
