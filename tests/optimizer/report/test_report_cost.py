"""The report's cost chart (issue 30): each trial's cost against the share of the study's SLOs it meets, read
from what each trial stored; the default trial and the pick are the marked points; a trial without a price is
counted in the caption, never silently left out."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import pytest
from optuna.trial import TrialState

from objectives import PRICE_KEY
from optimizer._storage import is_default, trial_metrics
from optimizer.report import build_charts, gather
from optimizer.report._figures import cost_chart
from report_test_helpers import report_spec_dict

DEVICES = ["L40S", "H100-SXM"]


@pytest.fixture(scope="module")
def gpu_list_study(tmp_path_factory):
    """The mini report study on a GPU list (L40S first: the default runs there), 2 devices x 2 max_num_seqs."""
    from optimizer._executors import InProcessExecutor
    from optimizer._spec import StudySpec
    from optimizer._study import Tuner

    d = report_spec_dict(name="report-cost", gpu=DEVICES, search={"base": "none", "max_num_seqs": [16, 256]},
                         sampler={"name": "grid", "seed": 0}, budget={"trials": 8, "trial_timeout_s": 120})
    d["workload"]["max_requests"] = 120
    spec = StudySpec.from_dict(d, base_dir=Path.cwd())
    out = tmp_path_factory.mktemp("report-cost")
    tuner = Tuner(spec, out=out, executor=InProcessExecutor(), progress=io.StringIO())
    result = tuner.run()
    trials = tuner.study.get_trials()
    return {"spec": spec, "ctx": tuner.ctx, "storage": result.storage, "trials": trials, "out": out}


def _stored(t) -> tuple[float, float]:
    """(share of SLO targets met in %, USD per million output tokens) from the trial's stored attributes."""
    violations = t.user_attrs["constraints"]
    metrics = trial_metrics(t)
    usd = metrics[PRICE_KEY] / 3600.0 / metrics["output_tokens_per_s"] * 1e6
    return 100.0 * sum(v <= 0 for v in violations) / len(violations), usd


def _chart(data):
    charts = {c.id: c for c in build_charts(data)}
    assert "cost" in charts, list(charts)
    return charts["cost"]


def test_cost_chart_plots_the_stored_values_and_marks_the_default_and_the_pick(gpu_list_study):
    s = gpu_list_study
    data = gather(s["spec"], s["ctx"], s["trials"], s["storage"], simulate=False)
    chart = _chart(data)
    complete = {t.number: t for t in s["trials"] if t.state == TrialState.COMPLETE}
    assert len(complete) == 5  # the default and the 2 x 2 grid
    traces = {tr.name: tr for tr in chart.figure.data}
    # One trace per device; every complete trial drawn once, at its stored values.
    assert set(DEVICES) <= set(traces)
    drawn = {}
    for device in DEVICES:
        tr = traces[device]
        for x, share, y, text in zip(tr.x, tr.customdata, tr.y, tr.text):
            number = int(text.split("<br>")[0].split()[1])
            drawn[number] = (share, y)
            assert abs(x - share) <= 3  # devices side by side around the share
            assert complete[number].user_attrs["knobs"].get("gpu", "L40S") == device
            assert device in text.split("<br>")[1]
    assert sorted(drawn) == sorted(complete)
    for number, (x, y) in drawn.items():
        sx, sy = _stored(complete[number])
        assert x == pytest.approx(sx, rel=1e-3) and y == sy, number
    # The default is the marked diamond, at the stored default trial's values.
    default = next(t for t in complete.values() if is_default(t))
    mark = traces["engine default config"]
    assert mark.marker.symbol == "diamond" and len(mark.y) == 1
    assert (mark.customdata[0], mark.y[0]) == drawn[default.number]
    assert mark.x[0] == traces["L40S"].x[0]  # on its device's point
    assert f"Diamond: the engine's default config (trial {default.number})" in chart.caption
    # The pick is the star.
    pick = data.pick.trial.number
    star = traces[f"recommended (trial {pick})"]
    assert star.marker.symbol == "star" and (star.customdata[0], star.y[0]) == drawn[pick]
    assert "All 5 complete trials are drawn" in chart.caption
    assert chart.figure.layout.yaxis.title.text.startswith("USD per million output tokens")


def test_a_trial_without_a_price_is_counted_in_the_caption(gpu_list_study):
    s = gpu_list_study
    data = gather(s["spec"], s["ctx"], s["trials"], s["storage"], simulate=False)
    default_row = data.trials.index[data.trials["default"]][0]
    data.trials.loc[default_row, PRICE_KEY] = math.nan  # as if the default's device had no price
    chart = _chart(data)
    names = [tr.name for tr in chart.figure.data]
    assert "engine default config" not in names
    assert sum(len(tr.x) for tr in chart.figure.data if tr.name in DEVICES) == 4
    assert ("Not drawn: 1 of 5 complete trials, 1 of them on a device without a price (L40S); the default config "
            "is among them") in chart.caption


def test_a_cost_objective_is_the_charted_cost(gpu_list_study):
    s = gpu_list_study
    data = gather(s["spec"], s["ctx"], s["trials"], s["storage"], simulate=False)
    # Only the cost chart reads this objective (the study did not store it as one).
    data.spec = dataclasses.replace(data.spec, objectives=("cost_per_hour_usd", *data.spec.objectives))
    chart = cost_chart(data)
    complete = {t.number: t for t in s["trials"] if t.state == TrialState.COMPLETE}
    prices = sorted(trial_metrics(t)[PRICE_KEY] for t in complete.values())
    assert sorted(y for tr in chart.figure.data if tr.name in DEVICES for y in tr.y) == prices
    assert "Cost: cost_per_hour_usd, the study's cost objective" in chart.caption


def test_the_page_shows_the_cost_chart_under_1_mb(gpu_list_study, tmp_path):
    from optimizer.report import write_report

    s = gpu_list_study
    result = write_report(s["spec"], out=tmp_path, storage=s["storage"], context=s["ctx"], png=False)
    html = result.html.read_text()
    assert "cost" in result.charts and 'id="chart-cost"' in html and "Cost against SLO attainment" in html
    assert result.html.stat().st_size <= 1_000_000
