"""Tail latency by cohort (class, prompt length, output length, preemption count): the default and
recommended configs' p99 per cohort, and the heatmap of every trial's p99 per cohort.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import (
    DEFAULT_COLOR, PALETTE, RECOMMENDED_COLOR, Chart, _class_names, _finite, _fmt, _layout, _log_ticks,
    _param_names, _present, _short, _slo_line, _sorted_by_params,
)
from optimizer.report._data import ReportData

#: Most trials the per-trial heatmap lists one by one (beyond it: the Pareto front only).
HEATMAP_MAX_ROWS = 60
#: Cohort groupings of the summary after the classes: key prefix and how a bucket label sorts.
COHORT_GROUPS = (("prompt", "prompt"), ("output", "output"), ("preempted", "preempted"))


def _bucket_order(label: str) -> float:
    head = label.split("-")[0].rstrip("+")
    try:
        return float(head)
    except ValueError:
        return math.inf


def cohort_labels(metrics_list: Sequence[dict[str, float]], classes: Sequence[str]) -> list[tuple[str, str]]:
    """``(label, key prefix)`` of every class, then every prompt-length, output-length and preemption-count
    bucket that holds requests in any run."""
    out = [(f"class {c}", f"class.{c}") for c in classes]
    for group, title in COHORT_GROUPS:
        buckets: list[str] = []
        for metrics in metrics_list:
            for key, value in metrics.items():
                if key.startswith(f"{group}.") and key.endswith(".count.total") and _finite(value) > 0:
                    label = key[len(group) + 1:-len(".count.total")]
                    if label not in buckets:
                        buckets.append(label)
        buckets.sort(key=_bucket_order)
        out += [(f"{title} {b}", f"{group}.{b}") for b in buckets]
    return out


def cohort_chart(data: ReportData) -> Chart | None:
    runs = [r for r in data.runs if r.ok]
    if not runs:
        return None
    cohorts = cohort_labels([r.metrics for r in runs], _class_names(data))
    labels = [c[0] for c in cohorts]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["p99 E2E (s; label: share of the cohort censored)",
                                        "p99 TTFT (s; label: share of the cohort censored)",
                                        "requests that did not finish (timed out / cancelled / rejected / unfinished)"])
    colors = {0: DEFAULT_COLOR, 1: RECOMMENDED_COLOR}
    for i, run in enumerate(runs):
        color = colors.get(i, PALETTE[i % len(PALETTE)])
        m = run.metrics
        for row, metric in ((1, "e2e_s"), (2, "ttft_s")):
            censored = [_finite(m.get(f"{p}.{metric}.censored_share")) for _, p in cohorts]
            fig.add_trace(go.Bar(x=labels, y=[_finite(m.get(f"{p}.{metric}.p99")) for _, p in cohorts],
                                 name=run.label, legendgroup=run.label, showlegend=row == 1, marker_color=color,
                                 offsetgroup=str(i), customdata=[100 * c for c in censored],
                                 text=[f"{100 * c:.0f}%" if c > 0 else "" for c in censored], textposition="outside",
                                 hovertemplate="%{x}<br>p99 %{y:.4g} s<br>censored %{customdata:.1f}%<extra>"
                                               + run.label + "</extra>"),
                          row=row, col=1)
        lost, text = [], []
        for _, p in cohorts:
            parts = {s: int(_finite(m.get(f"{p}.count.{s}")) or 0) if not math.isnan(_finite(m.get(f"{p}.count.{s}"))) else 0
                     for s in ("timed_out", "cancelled", "rejected", "unfinished")}
            total = int(_finite(m.get(f"{p}.count.total")) or 0) if not math.isnan(_finite(m.get(f"{p}.count.total"))) else 0
            lost.append(sum(parts.values()))
            text.append(f"of {total}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in parts.items()))
        fig.add_trace(go.Bar(x=labels, y=lost, name=run.label, legendgroup=run.label, showlegend=False,
                             marker_color=color, offsetgroup=str(i), text=text, textposition="none",
                             hovertemplate="%{x}<br>%{y} did not finish<br>%{text}<extra>" + run.label + "</extra>"),
                      row=3, col=1)
    for cname, cls in data.ctx.classes.items():
        for row, metric in ((1, "e2e_s"), (2, "ttft_s")):
            target = cls.slo.targets().get(metric)
            if target is not None:
                _slo_line(fig, target, f"{cname} SLO {target:g} s", "#555", row=row, col=1, log=False)
    fig.update_layout(barmode="group")
    fig.update_yaxes(rangemode="tozero", title_text="seconds", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="seconds", row=2, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="requests", row=3, col=1)
    caption = ("Tail latency by cohort (request class, prompt length, output length in tokens, then how often the "
               "request was preempted) for the default and the recommended config. Requests that timed out, were "
               "cancelled or rejected enter the p99 as censored values (at least their timeout); the label over each "
               "bar is the share of the cohort censored, so a p99 stuck at the timeout still tells 2% lost from 55%, "
               "and the bottom panel counts them.")
    return Chart("cohort-tail", "Tail by cohort, including timed-out and cancelled requests", caption,
                 _layout(fig, 760))


def cohort_heatmap_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if len(df) < 2:
        return None
    rows = df if len(df) <= HEATMAP_MAX_ROWS else df[df["pareto"]]
    if not len(rows):
        return None
    names = _param_names(data)
    rows = _sorted_by_params(rows, names)
    cohorts = cohort_labels([r.to_dict() for _, r in rows.iterrows()], _class_names(data))
    z, text, ylabels = [], [], []
    for _, row in rows.iterrows():
        values = [_finite(row.get(f"{p}.e2e_s.p99")) for _, p in cohorts]
        z.append([math.log10(v) if v > 0 else math.nan for v in values])
        text.append([_fmt(v) for v in values])
        params = ", ".join(f"{n}={_short(row.get(f'param.{n}'))}" for n in names if _present(row.get(f"param.{n}")))
        mark = " *" if data.pick is not None and int(row["number"]) == data.pick.trial.number else ""
        mark += " (default)" if row.get("default") else ""
        ylabels.append(f"#{int(row['number'])}{mark} {params}")
    finite = [v for line in z for v in line if not math.isnan(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    ticks = _log_ticks(lo, hi)
    fig = go.Figure(go.Heatmap(z=z, x=[c[0] for c in cohorts], y=ylabels, text=text, texttemplate="%{text}",
                               colorscale="YlOrRd", zmin=lo, zmax=hi if hi > lo else lo + 1,
                               colorbar=dict(title="p99 E2E (s)", tickvals=[math.log10(t) for t in ticks],
                                             ticktext=[f"{t:g}" for t in ticks]),
                               hovertemplate="%{y}<br>%{x}<br>p99 E2E %{text} s<extra></extra>"))
    fig.update_yaxes(autorange="reversed", automargin=True)
    height = max(420, 140 + 26 * len(ylabels))
    which = "every complete trial" if len(rows) == len(df) else "the Pareto-optimal trials"
    caption = (f"p99 E2E (seconds, censored) of each cohort for {which}, sorted by the searched knobs; * marks the "
               "recommended trial. Read a column to see which config serves that class or prompt length best.")
    return Chart("cohort-heatmap", "p99 E2E by cohort for each trial", caption, _layout(fig, height))
