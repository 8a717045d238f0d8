"""The report's content: it recommends what ``kvtune export`` recommends, shows every chart the study has data for,
and its numbers are the re-simulated default and recommended configs' summaries."""

from __future__ import annotations

import base64
import gzip
import json
import math
import re

import optuna
import pandas as pd
import pytest
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from objectives import summarize
from optimizer._export import choose
from sim.profiles import load_gpu
from optimizer.report import ConfigRun, Sweep, WhatIf, build_charts, gather, timeline_frame, translate_flavor
from optimizer._storage import trial_metrics
from optimizer.report._data import trial_frame
from optimizer.report._figures import cohort_chart, cohort_labels
from sim.errors import ConfigError

ALWAYS = ("pareto", "class-tail", "waste", "timeline", "cohort-tail")


def test_report_files_and_charts(written_report):
    html = written_report.html.read_text()
    assert written_report.html.name == "report.html" and written_report.json.exists()
    for chart in (*ALWAYS, "sweep-max_num_seqs", "whatif", "cohort-heatmap"):
        assert chart in written_report.charts
        assert f'id="chart-{chart}"' in html, chart
    # One self-contained page: plotly.js inlined once (gzip, base64), nothing fetched from a CDN.
    assert html.count('class="kvtune-figure"') == len(written_report.charts)
    assert html.count('id="kvtune-plotlyjs"') == 1 and html.count('id="kvtune-template"') == 1
    assert "<script src=" not in html and "<link " not in html
    packed = re.search(r'id="kvtune-plotlyjs">([^<]+)<', html).group(1)
    # plotly.js's cartesian bundle (optimizer/report/vendor), of the installed plotly's plotly.js version.
    bundle = gzip.decompress(base64.b64decode(packed)).decode()
    assert bundle.startswith(f"/**\n* plotly.js (cartesian - minified) v{get_plotlyjs_version()}\n")
    figures = re.findall(r'class="kvtune-figure" data-div="[^"]+">(.*?)</script>', html)
    assert all("template" not in json.loads(f)["layout"] for f in figures)  # carried once, not per chart
    assert len(html) < 1_000_000  # plotly.min.js alone is 4.8 MB
    assert written_report.images == [] and "turned off" in written_report.image_error


def test_report_page_weighs_at_most_1_mb(written_report):
    """The page (every chart of the mini study, a what-if and a sweep included) stays under 1 MB: plotly.js's
    cartesian bundle is 0.66 MB of it, the full one would be 1.96 MB."""
    assert written_report.html.stat().st_size <= 1_000_000
    from optimizer.report._page import partial_bundle

    assert partial_bundle() is not None, "no vendored plotly.js bundle for the installed plotly (vendor/README.md)"


def test_a_trace_outside_the_partial_bundle_inlines_the_full_plotlyjs(written_report):
    """A chart with a trace type the cartesian bundle cannot draw gets the full plotly.js (a larger page, drawn)."""
    from optimizer.report._figures import Chart
    from optimizer.report._page import render_page

    polar = Chart("polar", "polar", "", go.Figure(go.Scatterpolar(r=[1, 2], theta=[0, 90])))
    html = render_page(written_report.data, [polar])
    packed = re.search(r'id="kvtune-plotlyjs">([^<]+)<', html).group(1)
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs()


def test_recommendation_matches_export(tuned_study, written_report):
    study = optuna.load_study(study_name="report-mini", storage=tuned_study["storage"])
    pick = choose(study.get_trials(), tuned_study["ctx"])
    doc = json.loads(written_report.json.read_text())
    assert doc["pick"]["trial"] == pick.trial.number
    assert doc["pick"]["feasible"] == pick.feasible
    assert doc["recommended"]["knobs"] == pick.trial.user_attrs["knobs"]
    assert doc["default"]["knobs"] == tuned_study["spec"].fixed_knobs()
    assert sorted(doc["pareto_trials"]) == sorted(t.number for t in pick.front)


def test_resimulated_numbers_are_the_runs_summaries(tuned_study, written_report):
    """The default/recommended numbers on the page are ``summarize`` of the fresh runs' own tables."""
    data = written_report.data
    for run in (data.default, data.recommended):
        assert run.ok and run.requests is not None and run.steps is not None
        fresh = summarize(run.requests, run.steps, tuned_study["ctx"].classes).to_dict()
        for key in ("output_tokens_per_s", "recompute_busy_share", "new_token_busy_share", "class.chat.e2e_s.p99",
                    "class.long_prompt.count.timed_out"):
            assert fresh[key] == pytest.approx(run.metrics[key], nan_ok=True)
    doc = json.loads(written_report.json.read_text())
    chat = doc["recommended"]["classes"]["chat"]
    assert chat["e2e_s.p99"] == pytest.approx(data.recommended.metrics["class.chat.e2e_s.p99"])
    # With one replicate, the recommended run reproduces the trial's stored metrics exactly.
    row = data.trials[data.trials["number"] == data.pick.trial.number].iloc[0]
    assert row["output_tokens_per_s"] == pytest.approx(data.recommended.metrics["output_tokens_per_s"])
    # The page states the per-class comparison with both values.
    html = written_report.html.read_text()
    value = data.default.metrics["class.chat.e2e_s.p99"]
    assert f"{value:.4g}" in html


def test_default_config_marked_on_pareto_chart(written_report):
    charts = {c.id: c for c in build_charts(written_report.data)}
    names = [t.name for t in charts["pareto"].figure.data]
    assert "engine default config" in names
    assert any(n.startswith("recommended") for n in names)
    assert "Pareto front" in names


def test_trial_table_reads_stored_attributes(tuned_study):
    study = optuna.load_study(study_name="report-mini", storage=tuned_study["storage"])
    trials = study.get_trials()
    frame = trial_frame(trials, tuned_study["spec"].objectives, [])
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(frame) == len(complete)
    assert frame["default"].tolist() == [bool(t.user_attrs.get("kvtune_default")) for t in complete]
    assert frame["default"].sum() == 1 and not complete[0].params  # the default config: trial 0, nothing searched
    t = complete[1]
    metrics = trial_metrics(t)
    # the bucket cohorts are stored together (prompt_buckets, output_buckets, preempted_buckets) and come back
    # under their flat keys
    for prefix in ("prompt", "output", "preempted"):
        assert any(k.startswith(f"{prefix}.") and k.endswith(".e2e_s.p99") for k in metrics), prefix
    assert "knobs" not in metrics and "constraints" not in metrics
    row = frame[frame["number"] == t.number].iloc[0]
    assert row["objective.output_tokens_per_s"] == pytest.approx(t.values[0])
    assert row["param.max_num_seqs"] == t.params["max_num_seqs"]
    assert row["knob.num_gpu_blocks_override"] == 1200


def test_failed_trials_listed_with_reason(tuned_study, tmp_path):
    """A failed trial (an impossible config) is listed with its reason; the report still renders."""
    from optimizer.report import write_report

    storage = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name="report-mini", from_storage=tuned_study["storage"], to_storage=storage)
    study = optuna.load_study(study_name="report-mini", storage=storage)
    trial = study.ask()
    trial.set_user_attr("fail_reason", "TrialError: engine aborted: swap space exhausted")
    trial.set_user_attr("fail_kind", "error")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    result = write_report(tuned_study["spec"], out=tmp_path / "r", storage=storage, context=tuned_study["ctx"],
                          png=False)
    html = result.html.read_text()
    assert "Failed trials" in html and "swap space exhausted" in html


def test_missing_storage_is_a_config_error(tuned_study, tmp_path):
    from optimizer.report import write_report

    with pytest.raises(ConfigError, match="does not exist"):
        write_report(tuned_study["spec"], out=tmp_path, storage=f"sqlite:///{tmp_path / 'nope.db'}", png=False)


def test_study_without_complete_trials_renders(tuned_study, tmp_path):
    """A study whose every trial failed still gets a page (saying so) with the default config's timeline."""
    from optimizer.report import write_report

    storage = f"sqlite:///{tmp_path / 'empty.db'}"
    study = optuna.create_study(study_name="report-mini", storage=storage, directions=["maximize", "minimize"])
    trial = study.ask()
    trial.set_user_attr("fail_reason", "timed out after 1 s")
    trial.set_user_attr("fail_kind", "timeout")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    result = write_report(tuned_study["spec"], out=tmp_path / "r", storage=storage, context=tuned_study["ctx"],
                          png=False)
    html = result.html.read_text()
    assert "no complete trial" in html
    assert "timeline" in result.charts and "pareto" not in result.charts


# ---- what-ifs and sweeps ----------------------------------------------------------------------------------------
def test_whatif_runs_on_other_gpu(written_report):
    data = written_report.data
    (whatif, runs), = data.whatifs
    assert whatif.gpu == "H100-SXM"
    default = next(r for r in runs if r.label == "default")
    assert default.ok and default.gpu == "H100-SXM"
    # num_gpu_blocks_override pins the cache, so the what-if changes speed and price, not capacity
    assert default.num_gpu_blocks == data.default.num_gpu_blocks == 1200
    price = load_gpu("H100-SXM").price_per_hour_usd  # sim/data/hardware.yaml, with its source
    assert price > 0 and default.price_per_hour_usd == price
    assert default.usd_per_million_output_tokens == pytest.approx(
        price / 3600 / default.metrics["output_tokens_per_s"] * 1e6)


def test_sweep_sets_one_knob(written_report):
    (sweep, by_base), = written_report.data.sweeps
    assert sweep == Sweep("max_num_seqs", (32, 128, 512))
    assert set(by_base) == {"default", "recommended"}
    for runs in by_base.values():
        assert [r.knobs["max_num_seqs"] for r in runs] == [32, 128, 512]
        assert all(r.ok and r.requests is None for r in runs)  # summaries only


@pytest.mark.parametrize("text, label, changes", [
    ("gpu=H200", "gpu=H200", {"gpu": "H200"}),
    ("H200 fp8: gpu=H200,kv_cache_dtype=fp8", "H200 fp8", {"gpu": "H200", "kv_cache_dtype": "fp8"}),
    ("max_num_seqs=64", "max_num_seqs=64", {"max_num_seqs": 64}),
    ("flavor=vllm-v1", "flavor=vllm-v1", {"flavor": "vllm-v1"}),
])
def test_whatif_parse(text, label, changes):
    w = WhatIf.parse(text)
    assert w.label == label and dict(w.changes) == changes


@pytest.mark.parametrize("text, match", [
    ("gpu=B300", "unknown GPU"),
    ("max_num_seq=64", "did you mean 'max_num_seqs'"),
    ("gpu", "KEY=VALUE"),
])
def test_whatif_parse_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        WhatIf.parse(text)


def test_sweep_parse_errors():
    with pytest.raises(ConfigError, match="not an engine knob"):
        Sweep.parse("gpu=H100-SXM,H200")
    with pytest.raises(ConfigError, match="KNOB=V1"):
        Sweep.parse("max_num_seqs=")


def test_flavor_translation_maps_swap_to_offload_and_back():
    v0 = {"flavor": "vllm-v0", "preemption_mode": "swap", "swap_space_gb": 32.0, "block_size": 8,
          "enable_chunked_prefill": False, "max_num_seqs": 128}
    v1 = translate_flavor(v0, "vllm-v1")
    assert v1 == {"flavor": "vllm-v1", "kv_offloading_size_gb": 32.0, "block_size": 8, "max_num_seqs": 128}
    back = translate_flavor({**v1, "watermark": 0.05, "scheduling_policy": "priority"}, "vllm-v0")
    assert back["preemption_mode"] == "swap" and back["swap_space_gb"] == 32.0
    assert "watermark" not in back and "kv_offloading_size_gb" not in back and back["scheduling_policy"] == "fcfs"
    recompute = translate_flavor({"flavor": "vllm-v0", "preemption_mode": "recompute", "swap_space_gb": 4.0},
                                 "vllm-v1")
    assert recompute == {"flavor": "vllm-v1"}


# ---- chart builders on hand-made data ---------------------------------------------------------------------------
def test_timeline_samples_the_step_table():
    steps = pd.DataFrame({
        "step": [0, 1, 5], "num_steps": [1, 4, 1], "start_s": [0.0, 1.0, 9.0], "duration_s": [1.0, 8.0, 1.0],
        "num_running": [1, 3, 2], "num_waiting": [5, 2, 0], "num_swapped": [0, 0, 0],
        "prefill_tokens_new": [100, 0, 0], "prefill_tokens_recompute": [0, 0, 50], "decode_tokens": [0, 12, 2],
        "kv_blocks_used": [10, 50, 100], "kv_blocks_total": [100, 100, 100], "swap_out_blocks": [0, 0, 0],
        "swap_in_blocks": [0, 0, 0], "preempted": [0, 0, 2],
    })
    tl = timeline_frame(steps, bins=10)
    assert len(tl) == 10
    assert tl["kv_used_pct"].tolist() == [10.0] + [50.0] * 8 + [100.0]
    assert tl["num_running"].tolist() == [1] + [3] * 8 + [2]
    assert tl["preemptions"].sum() == 2 and tl["preemptions"].iloc[-1] == 2
    assert tl["recompute_tokens"].sum() == 50
    assert timeline_frame(steps.iloc[:0]).empty


def test_cohort_chart_counts_timed_out_and_cancelled(written_report):
    """Requests that did not finish appear in the cohort chart's bottom panel, per cohort and per config."""
    data = written_report.data
    base = dict(data.default.metrics)
    base.update({"class.chat.count.timed_out": 7.0, "class.chat.count.cancelled": 3.0,
                 "class.chat.count.rejected": 0.0, "class.chat.count.unfinished": 0.0})
    fake = ConfigRun("default", {}, "L40S", metrics=base, num_gpu_blocks=1, block_size=16)
    original = data.default
    try:
        data.default = fake
        chart = cohort_chart(data)
    finally:
        data.default = original
    bars = [t for t in chart.figure.data if t.type == "bar" and t.yaxis == "y3"]
    lost = dict(zip(bars[0].x, bars[0].y))
    assert lost["class chat"] == 10
    assert "timed out 7" in bars[0].text[list(bars[0].x).index("class chat")]


def test_cohort_labels_skip_empty_buckets():
    metrics = {"prompt.0-512.count.total": 3.0, "prompt.512-1024.count.total": 0.0, "prompt.8192-inf.count.total": 1.0}
    labels = cohort_labels([metrics], ["a"])
    assert labels == [("class a", "class.a"), ("prompt 0-512", "prompt.0-512"), ("prompt 8192-inf", "prompt.8192-inf")]


def test_gather_without_simulation(tuned_study):
    study = optuna.load_study(study_name="report-mini", storage=tuned_study["storage"])
    data = gather(tuned_study["spec"], tuned_study["ctx"], study.get_trials(), tuned_study["storage"], simulate=False)
    assert data.default is None and data.recommended is None
    assert data.pick is not None and data.front_numbers
    assert set(data.trials["pareto"][data.trials["number"].isin(data.front_numbers)]) == {True}
    charts = [c.id for c in build_charts(data)]
    assert "pareto" in charts and "timeline" not in charts
    assert all(math.isfinite(v) for v in data.trials["objective.output_tokens_per_s"])
    assert re.match(r"^highest throughput", data.pick.rule)


def test_whatif_rate_scale_reruns_a_faster_workload(tuned_study):
    """``rate_scale`` replays the study's workload at a multiple of its request rate."""
    study = optuna.load_study(study_name="report-mini", storage=tuned_study["storage"])
    data = gather(tuned_study["spec"], tuned_study["ctx"], study.get_trials(), tuned_study["storage"],
                  whatifs=[WhatIf.parse("half rate: rate_scale=0.5")])
    (whatif, runs), = data.whatifs
    assert whatif.label == "half rate" and whatif.rate_scale == 0.5 and whatif.gpu is None
    default = next(r for r in runs if r.label == "default")
    assert default.ok and "rate_scale" not in default.knobs
    span = default.requests["arrival_s"].max() - default.requests["arrival_s"].min()
    base = data.default.requests["arrival_s"].max() - data.default.requests["arrival_s"].min()
    assert span == pytest.approx(2 * base)
    assert default.metrics["all.count.total"] == data.default.metrics["all.count.total"]
    with pytest.raises(ConfigError, match="rate_scale"):
        WhatIf.parse("rate_scale=-1")


def test_class_recompute_share_from_the_request_table():
    requests = pd.DataFrame({"class": ["a", "a", "b"], "prompt_tokens": [100, 300, 50],
                             "generated_tokens": [50, 50, 10], "recomputed_tokens": [0, 500, 0]})
    run = ConfigRun("x", {}, "L40S", requests=requests)
    assert run.class_recompute_share("a") == pytest.approx(500 / 1000)
    assert run.class_recompute_share("b") == 0.0
    assert math.isnan(ConfigRun("y", {}, "L40S").class_recompute_share("a"))


def test_without_a_browser_the_page_is_still_written(tuned_study, tmp_path, monkeypatch):
    """No Chrome/Chromium for kaleido: no PNGs, a note on the page and in report.json, the HTML as usual."""
    import optimizer.report._images as images
    from optimizer.report import write_report

    monkeypatch.setattr(images, "find_browser", lambda: None)
    result = write_report(tuned_study["spec"], out=tmp_path, storage=tuned_study["storage"],
                          context=tuned_study["ctx"], png=True)
    assert result.images == [] and "apt-get install -y chromium" in result.image_error
    assert "PNG images of the charts were not written" in result.html.read_text()
    assert json.loads(result.json.read_text())["image_error"] == result.image_error


def test_lifelines_follow_the_most_preempted_requests():
    from optimizer.report._lifelines import LifelineRecorder, lifelines
    from tests.sim.engine.conftest import make_sim, make_workload

    workload = make_workload([(0.0, 40, 60), (0.0, 40, 60), (0.05, 30, 50)])
    sim = make_sim(workload, step_s=0.01, per_token_s=1e-4, block_size=16, num_gpu_blocks_override=9,
                   max_model_len=128)
    recorder = LifelineRecorder()
    sim.core.observer = recorder
    result = sim.run()
    lines = lifelines(recorder, result.requests, result.steps)
    preempted = result.requests[result.requests["num_preemptions"] > 0]
    assert len(lines) == len(preempted) > 0
    top = lines[0]
    row = result.requests.set_index("request_id").loc[top.request_id]
    assert len(top.preempt_s) == row["num_preemptions"] == max(r["num_preemptions"] for _, r in preempted.iterrows())
    kinds = [k for k, _, _ in top.segments]
    assert kinds.count("preempted") == row["num_preemptions"] and "recompute" in kinds
    for kind, lo, hi in top.segments:
        assert row["arrival_s"] - 1e-9 <= lo <= hi <= row["end_s"] + 1e-9, (kind, lo, hi)
    waits = sum(hi - lo for k, lo, hi in top.segments if k == "preempted")
    assert waits == pytest.approx(row["resume_wait_s"])  # the orange bars are the resume waits


def test_timeline_busy_share_spreads_steps_over_bins():
    steps = pd.DataFrame({"step": [0, 1], "num_steps": [1, 10], "start_s": [0.0, 2.0], "duration_s": [1.0, 2.0],
                          "num_running": [1, 1], "num_waiting": [0, 0], "num_swapped": [0, 0],
                          "prefill_tokens_new": [10, 0], "prefill_tokens_recompute": [0, 0], "decode_tokens": [0, 10],
                          "kv_blocks_used": [1, 1], "kv_blocks_total": [10, 10], "swap_out_blocks": [0, 0],
                          "swap_in_blocks": [0, 0], "preempted": [0, 0],
                          "time_prefill_new_s": [0.9, 0.0], "time_recompute_s": [0.0, 0.0],
                          "time_decode_s": [0.0, 1.6], "time_transfer_s": [0.0, 0.0], "time_overhead_s": [0.1, 0.4]})
    tl = timeline_frame(steps, bins=4)  # bins of 1 s: busy, idle, busy, busy
    assert tl["busy_pct"].tolist() == pytest.approx([100.0, 0.0, 100.0, 100.0])
    assert tl["prefill_new_pct"].tolist() == pytest.approx([90.0, 0.0, 0.0, 0.0])
    assert tl["decode_pct"].tolist() == pytest.approx([0.0, 0.0, 80.0, 80.0])
    parts = tl[["prefill_new_pct", "recompute_pct", "decode_pct", "transfer_pct", "overhead_pct"]].sum(axis=1)
    assert parts.tolist() == pytest.approx(tl["busy_pct"].tolist())


def test_robustness_of_the_recommendation_is_in_the_page_and_json(written_report):
    """The recommendation re-simulated at KV blocks +-5% and step times +-10% (and the worst corner), recommended
    and default under the same perturbation; the verdicts follow from the rows."""
    doc = json.loads(written_report.json.read_text())
    robust = doc["robustness"]
    assert [r["perturbation"] for r in robust["perturbations"]] == [
        "kv_blocks -5%", "kv_blocks +5%", "step_time -10%", "step_time +10%", "kv_blocks -5%, step_time +10%"]
    rows = [r for r in robust["perturbations"] if "error" not in r]
    assert rows, robust
    for r in rows:
        assert r["recommended_output_tokens_per_s"] > 0 and r["default_output_tokens_per_s"] > 0
        assert r["beats_default"] == (r["recommended_output_tokens_per_s"] > r["default_output_tokens_per_s"])
    assert robust["meets_slos_under_all"] == (len(rows) == 5 and all(r["meets_all_slos"] for r in rows))
    html = written_report.html.read_text()
    assert "Robustness of the recommendation" in html and "kv_blocks -5%, step_time +10%" in html
