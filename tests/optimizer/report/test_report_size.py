"""What keeps the report page light with the same charts (issue 33): the per-trial charts write each parameter's
name once per trace (the trials' values go in ``customdata``), the timeline writes its evenly spaced time axis as
``x0``/``dx``, and a trial adds well under a kilobyte to the page (every bundled study's page at its full trial count:
tests/studies/test_studies_smoke.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from optimizer.report import build_charts, render_page, timeline_frame


def _charts(data):
    return {c.id: c for c in build_charts(data)}


def test_per_trial_hover_names_each_parameter_once(written_report):
    data = written_report.data
    names = [c[len("param."):] for c in data.trials.columns if c.startswith("param.")]
    assert names
    numbers = set(data.trials["number"].astype(int))
    checked = 0
    for chart_id in ("pareto", "class-tail", "waste"):
        for trace in _charts(data)[chart_id].figure.data:
            if trace.customdata is None:
                continue
            assert trace.text is None
            template = trace.hovertemplate
            assert all(template.count(f"<br>{n}=%{{customdata[") == 1 for n in names), template
            rows = [list(r) for r in trace.customdata]
            assert len(rows) == len(trace.x) and {int(r[0]) for r in rows} <= numbers
            assert all(len(r) == 2 + len(names) for r in rows)
            checked += 1
    assert checked >= 5


def test_timeline_gives_its_time_axis_as_x0_dx(written_report):
    data = written_report.data
    chart = _charts(data)["timeline"]
    run = data.runs[0]
    t = timeline_frame(run.steps)["t_s"].to_numpy()
    first = chart.figure.data[0]
    assert first.x is None and np.isclose(first.x0, t[0]) and np.isclose(first.dx, t[1] - t[0])
    assert all(tr.x is None and tr.x0 is not None for tr in chart.figure.data)


def test_a_trial_adds_under_800_bytes(written_report):
    data = written_report.data

    def page(trials: int) -> int:
        df = data.trials
        grown = pd.concat([df] * -(-trials // len(df)), ignore_index=True).head(trials)
        grown["number"] = range(trials)
        bigger = dataclasses.replace(data, trials=grown)
        return len(render_page(bigger, build_charts(bigger)).encode())

    per_trial = (page(200) - page(100)) / 100
    # 654 bytes here (2 parameters, 2 classes); 1,040 with the names and full floats in every trace
    assert 100 < per_trial < 800, per_trial


def test_lifelines_write_each_request_label_once(written_report):
    """The lifeline rows are numbered, their labels the axis's tick text (once), not repeated per segment."""
    data = written_report.data
    chart = _charts(data)["lifelines"]
    runs = [r for r in data.runs if r.ok and r.lifelines]
    for axis, run in zip(("yaxis", "yaxis2"), runs):
        ticks = chart.figure.layout[axis]
        assert list(ticks.ticktext) == [line.label for line in run.lifelines]
        assert list(ticks.range) == [len(run.lifelines) - 0.5, -0.5]  # the most preempted at the top
    for trace in chart.figure.data:
        assert all(isinstance(y, int) for y in trace.y), trace.name
        assert "%{customdata}" in trace.hovertemplate and len(trace.customdata) == len(trace.y)
    figure = chart.figure.to_json()
    for label in {line.label for run in runs for line in run.lifelines}:
        assert figure.count(label) == sum(label in [line.label for line in run.lifelines] for run in runs), label
