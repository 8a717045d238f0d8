"""What-if charts: the default and recommended configs (or every trial's) re-simulated on other hardware,
knob values or request rates (``kvtune report --whatif``).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import (
    DEFAULT_COLOR, FRONT_COLOR, RECOMMENDED_COLOR, TRIAL_COLOR, Chart, _class_names, _config_label, _finite, _fmt,
    _layout, _log_ticks, _param_names, _sorted_by_params, _trial_number,
)
from optimizer.report._data import ConfigRun, ReportData, WhatIf
from optimizer.report._figures_cohorts import cohort_labels


def whatif_rows(data: ReportData) -> list[tuple[str, ConfigRun]]:
    """(scenario, run) pairs: the study's own hardware first, then each what-if, for the default and recommended."""
    out: list[tuple[str, ConfigRun]] = []
    base = f"study ({data.spec.gpu})"
    for run in data.runs:
        out.append((base, run))
    for whatif, runs in data.whatifs:
        for run in runs:
            if run.label == "default" or run.label.startswith("recommended"):
                out.append((whatif.label, run))
    return out


def whatif_chart(data: ReportData) -> Chart | None:
    if not data.whatifs:
        return None
    pairs = whatif_rows(data)
    scenarios: list[str] = []
    for s, _ in pairs:
        if s not in scenarios:
            scenarios.append(s)
    panels = [("KV cache capacity (k tokens)", lambda r: r.kv_tokens / 1000.0),
              ("output tokens/s", lambda r: _finite(r.metrics.get("output_tokens_per_s"))),
              ("p99 E2E, all requests (s)", lambda r: _finite(r.metrics.get("all.e2e_s.p99"))),
              ("$ per million output tokens", lambda r: r.usd_per_million_output_tokens)]
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[0] for p in panels], vertical_spacing=0.16)
    for kind, color in (("default", DEFAULT_COLOR), ("recommended", RECOMMENDED_COLOR)):
        chosen = [(s, r) for s, r in pairs if r.label.startswith(kind) and r.ok]
        if not chosen:
            continue
        for i, (title, fn) in enumerate(panels):
            fig.add_trace(go.Bar(x=[s for s, _ in chosen], y=[fn(r) for _, r in chosen], name=f"{kind} config",
                                 legendgroup=kind, showlegend=i == 0, marker_color=color,
                                 hovertemplate="%{x}<br>%{y:.4g}<extra>" + kind + "</extra>"),
                          row=i // 2 + 1, col=i % 2 + 1)
    fig.update_layout(barmode="group")
    caption = ("The default and the recommended config of this study re-simulated on other hardware, knob values "
               "or request rates (what-ifs given to kvtune report with --whatif): KV blocks gained, throughput, "
               "tail latency and GPU cost per million output tokens at each GPU profile's $/GPU-hour "
               "(sim/data/hardware.yaml).")
    return Chart("whatif", "What-if: other hardware and knob values", caption, _layout(fig, 680))


def _trial_grids(data: ReportData) -> list[tuple[WhatIf, list[ConfigRun]]]:
    """The what-ifs that re-simulated every trial's config (``--whatif-trials all``); none without trials."""
    if not len(data.trials):
        return []
    return [(w, runs) for w, runs in data.whatifs if any(r.label.startswith("trial ") for r in runs)]


def whatif_grid_chart(data: ReportData) -> Chart | None:
    """For ``--whatif-trials all``: p99 E2E by cohort of every trial config, one panel per scenario."""
    grids = _trial_grids(data)
    if not grids:
        return None
    names = _param_names(data)
    classes = _class_names(data)
    scenarios: list[tuple[str, list[tuple[str, dict[str, float]]]]] = []
    base = []
    ordered = _sorted_by_params(data.trials, names)
    for _, row in ordered.iterrows():
        base.append((_config_label(row.to_dict(), names, int(row["number"])), row.to_dict()))
    scenarios.append((f"study ({data.spec.gpu})", base))
    for whatif, runs in grids:
        items = []
        for run in runs:
            if run.label.startswith("trial ") or run.label.startswith("recommended"):
                number = _trial_number(run.label)
                row = data.trials[data.trials["number"] == number]
                label = _config_label(row.iloc[0].to_dict(), names, number) if len(row) else run.label
                items.append((label, run.metrics if run.ok else {}))
        scenarios.append((whatif.label, sorted(items, key=lambda x: [b for b, _ in base].index(x[0])
                                                if x[0] in [b for b, _ in base] else 1e9)))
    cohorts = cohort_labels([m for _, items in scenarios for _, m in items], classes)
    fig = make_subplots(rows=1, cols=len(scenarios), shared_yaxes=True, horizontal_spacing=0.02,
                        subplot_titles=[s for s, _ in scenarios])
    all_values = [_finite(m.get(f"{p}.e2e_s.p99")) for _, items in scenarios for _, m in items for _, p in cohorts]
    finite = [math.log10(v) for v in all_values if v > 0]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    ticks = _log_ticks(lo, hi)
    ylabels = [b for b, _ in base]
    for col, (scenario, items) in enumerate(scenarios, start=1):
        by_label = dict(items)
        z, text = [], []
        for label in ylabels:
            m = by_label.get(label, {})
            values = [_finite(m.get(f"{p}.e2e_s.p99")) for _, p in cohorts]
            z.append([math.log10(v) if v > 0 else math.nan for v in values])
            text.append([_fmt(v) for v in values])
        fig.add_trace(go.Heatmap(z=z, x=[c[0] for c in cohorts], y=ylabels, text=text, texttemplate="%{text}",
                                 colorscale="YlOrRd", zmin=lo, zmax=hi if hi > lo else lo + 1, showscale=col == 1,
                                 colorbar=dict(title="p99 E2E (s)", tickvals=[math.log10(t) for t in ticks],
                                               ticktext=[f"{t:g}" for t in ticks]),
                                 hovertemplate=f"{scenario}<br>%{{y}}<br>%{{x}}<br>p99 E2E %{{text}} s<extra></extra>"),
                      row=1, col=col)
    fig.update_yaxes(autorange="reversed", automargin=True)
    height = max(420, 160 + 30 * len(ylabels))
    caption = ("Every trial's config re-simulated under each what-if: p99 E2E (s, censored) per cohort. Compare "
               "the same row across panels to see how the answer moves with the hardware.")
    return Chart("whatif-grid", "What-if: every trial config per scenario", caption, _layout(fig, height))


def whatif_throughput_chart(data: ReportData) -> Chart | None:
    """For ``--whatif-trials all``: output tokens/s and recompute share of every trial config, per scenario."""
    grids = _trial_grids(data)
    if not grids:
        return None
    names = _param_names(data)
    ordered = _sorted_by_params(data.trials, names)
    labels = {int(r["number"]): _config_label(r.to_dict(), names, int(r["number"])) for _, r in ordered.iterrows()}
    scenarios = [(f"study ({data.spec.gpu})", {n: data.trials[data.trials["number"] == n].iloc[0].to_dict()
                                                for n in labels})]
    for whatif, runs in grids:
        scenarios.append((whatif.label, {_trial_number(r.label): r.metrics for r in runs
                                         if r.ok and (r.label.startswith("trial ") or r.label.startswith("recommended"))}))
    fig = make_subplots(rows=2, cols=len(scenarios), shared_yaxes=True, horizontal_spacing=0.02,
                        vertical_spacing=0.08, subplot_titles=[s for s, _ in scenarios] + [""] * len(scenarios))
    ylabels = list(labels.values())
    for col, (scenario, by_number) in enumerate(scenarios, start=1):
        numbers = [n for n in labels if n in by_number]
        for row, key, scale, color, title in ((1, "output_tokens_per_s", 1.0, TRIAL_COLOR, "output tokens/s"),
                                              (2, "recompute_busy_share", 100.0, FRONT_COLOR, "recompute share (%)")):
            fig.add_trace(go.Scatter(x=[scale * _finite(by_number[n].get(key)) for n in numbers],
                                     y=[labels[n] for n in numbers], mode="markers", showlegend=False,
                                     marker=dict(color=color, size=10),
                                     hovertemplate=f"{scenario}<br>%{{y}}<br>{title} %{{x:.4g}}<extra></extra>"),
                          row=row, col=col)
            fig.update_xaxes(title_text=title, row=row, col=col)
    fig.update_yaxes(autorange="reversed", automargin=True, categoryorder="array", categoryarray=ylabels)
    height = max(520, 200 + 2 * 26 * len(ylabels))
    caption = ("Throughput (top) and recompute share (bottom) of every trial config under each what-if; each panel "
               "has its own scale, so compare rows within a panel (which config wins on that hardware) and the "
               "ordering across panels.")
    return Chart("whatif-throughput", "What-if: throughput of every trial config per scenario", caption,
                 _layout(fig, height))
