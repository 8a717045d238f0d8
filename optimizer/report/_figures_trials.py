"""Charts of the trials in objective space: the Pareto front, each class's p99 against throughput, and
the recompute and new-token busy shares per trial (one marker per trial).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import (
    DEFAULT_COLOR, FRONT_COLOR, INFEASIBLE_COLOR, PALETTE, RECOMMENDED_COLOR, TRIAL_COLOR, Chart, _class_names,
    _finite, _hover, _layout, _objective_value, _param_names, _rounded, _slo_line,
)
from optimizer.report._data import ReportData


def pareto_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if not len(df):
        return None
    names = data.objective_names
    hover = _hover(data)
    fig = go.Figure()
    if len(names) >= 2:
        xcol, ycol = f"objective.{names[0]}", f"objective.{names[1]}"
        xlabel, ylabel = _axis_label(data, 0), _axis_label(data, 1)
    else:
        xcol, ycol = "number", f"objective.{names[0]}"
        xlabel, ylabel = "trial", _axis_label(data, 0)
    groups = [("feasible trials", df["feasible"] & ~df["pareto"], TRIAL_COLOR, "circle", 0.6),
              ("trials missing an SLO", ~df["feasible"] & ~df["pareto"], INFEASIBLE_COLOR, "x", 0.8)]
    for label, mask, color, symbol, opacity in groups:
        if mask.any():
            fig.add_trace(go.Scatter(x=_compact(df.loc[mask, xcol]), y=_compact(df.loc[mask, ycol]), mode="markers",
                                     name=label,
                                     marker=dict(color=color, symbol=symbol, size=8, opacity=opacity),
                                     customdata=hover.take(np.flatnonzero(mask.to_numpy())),
                                     hovertemplate=hover.template + "<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
    front = df[df["pareto"]].sort_values(xcol)
    if len(front):
        fig.add_trace(go.Scatter(x=_compact(front[xcol]), y=_compact(front[ycol]), mode="lines+markers",
                                 name="Pareto front",
                                 line=dict(color=FRONT_COLOR, width=2), marker=dict(color=FRONT_COLOR, size=10),
                                 customdata=hover.take(front.index),
                                 hovertemplate=hover.template + "<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
    if data.pick is not None:
        row = df[df["number"] == data.pick.trial.number]
        if len(row):
            fig.add_trace(go.Scatter(x=row[xcol], y=row[ycol], mode="markers", name=f"recommended (trial {data.pick.trial.number})",
                                     marker=dict(color=RECOMMENDED_COLOR, symbol="star", size=20,
                                                 line=dict(color="black", width=1)),
                                     hovertemplate="recommended<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
    if data.default is not None and data.default.ok:
        if len(names) >= 2:
            x = _objective_value(data, 0, data.default.metrics)
            y = _objective_value(data, 1, data.default.metrics)
            if not (math.isnan(x) or math.isnan(y)):
                fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name="engine default config",
                                         marker=dict(color=DEFAULT_COLOR, symbol="diamond", size=14,
                                                     line=dict(color="white", width=1)),
                                         hovertemplate="default config<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
        else:
            y = _objective_value(data, 0, data.default.metrics)
            if not math.isnan(y):
                fig.add_hline(y=y, line=dict(color=DEFAULT_COLOR, dash="dash"),
                              annotation_text="engine default config", annotation_position="top left")
    axes = (("x", 0), ("y", 1)) if len(names) >= 2 else (("y", 0),)
    for axis, index in axes:
        key = getattr(data.ctx.objectives[index], "key", "")
        for cname, cls in data.ctx.classes.items():
            for metric, target in cls.slo.targets().items():
                if key != f"class.{cname}.{metric}.p99":
                    continue
                if axis == "y":
                    _slo_line(fig, target, f"{cname} SLO {target:g} s", FRONT_COLOR, row=None, col=None, log=False)
                else:
                    fig.add_vline(x=target, line=dict(color=FRONT_COLOR, dash="dash", width=1),
                                  annotation_text=f"{cname} SLO {target:g} s")
    fig.update_xaxes(title_text=xlabel)
    fig.update_yaxes(title_text=ylabel)
    caption = (f"Every complete trial in objective space. Red: the Pareto front"
               f"{' of trials meeting every SLO' if data.pick is not None and data.pick.feasible else ''}; "
               "star: the recommended config (the pick of kvtune export); diamond: the engine's default config "
               "(vLLM defaults plus the study's fixed knobs), simulated afresh on the same workload.")
    if len(names) > 2:
        caption += f" The study has {len(names)} objectives; the chart shows the first two."
    return Chart("pareto", "Pareto front", caption, _layout(go.Figure(fig), 560))


def _compact(values: pd.Series, digits: int = 4) -> pd.Series | list[float]:
    """A trace's per-trial values for the page: floats rounded to ``digits`` significant digits (at least what
    the hover shows: ``.4g``, or ``.3f`` of a percentage with 6), whole numbers and labels as they are; the
    per-trial charts are what grows with a study's trials (issue 33: the page <= 1 MB)."""
    if not pd.api.types.is_float_dtype(values):
        return values
    return _rounded(values, digits)


def _axis_label(data: ReportData, index: int) -> str:
    name = data.objective_names[index]
    direction = data.ctx.objectives[index].direction
    return f"{name} ({'higher' if direction == 'maximize' else 'lower'} is better)"


def class_tail_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if not len(df) or "output_tokens_per_s" not in df:
        return None
    classes = _class_names(data)
    metrics = [("ttft_s", "p99 TTFT (s)"), ("e2e_s", "p99 E2E (s)")]
    fig = make_subplots(rows=1, cols=2, subplot_titles=[m[1] + " by class" for m in metrics], horizontal_spacing=0.09)
    hover = _hover(data)
    front = df[df["pareto"]].sort_values("output_tokens_per_s")
    for ci, name in enumerate(classes):
        color = PALETTE[ci % len(PALETTE)]
        for mi, (metric, _) in enumerate(metrics):
            key = f"class.{name}.{metric}.p99"
            if key not in df:
                continue
            y = _compact(df[key].map(_finite))
            fig.add_trace(go.Scatter(x=_compact(df["output_tokens_per_s"]), y=y, mode="markers",
                                     name=f"{name}: all trials",
                                     legendgroup=name, showlegend=mi == 0,
                                     marker=dict(color=color, size=6, opacity=0.35),
                                     customdata=hover.rows,
                                     hovertemplate=f"class {name}<br>" + hover.template
                                                   + "<br>out tok/s=%{x:.4g}<br>p99=%{y:.4g} s<extra></extra>"),
                          row=1, col=mi + 1)
            if len(front):
                fig.add_trace(go.Scatter(x=_compact(front["output_tokens_per_s"]), y=_compact(front[key].map(_finite)),
                                         mode="lines+markers", name=f"{name}: Pareto front", legendgroup=name,
                                         showlegend=mi == 0, line=dict(color=color, width=2),
                                         marker=dict(color=color, size=9),
                                         customdata=hover.take(front.index),
                                         hovertemplate=f"class {name} (Pareto)<br>" + hover.template
                                                       + "<br>out tok/s=%{x:.4g}<br>p99=%{y:.4g} s<extra></extra>"),
                              row=1, col=mi + 1)
            target = data.ctx.classes[name].slo.targets().get(metric)
            if target is not None:
                _slo_line(fig, target, f"{name} SLO {target:g} s", color, row=1, col=mi + 1, log=True)
            for run, symbol, rcolor in ((data.default, "diamond", DEFAULT_COLOR),
                                        (data.recommended, "star", RECOMMENDED_COLOR)):
                if run is None or not run.ok:
                    continue
                fig.add_trace(go.Scatter(x=[_finite(run.metrics.get("output_tokens_per_s"))],
                                         y=[_finite(run.metrics.get(key))], mode="markers",
                                         name=run.label.split(" (")[0], legendgroup=run.label,
                                         showlegend=ci == 0 and mi == 0,
                                         marker=dict(color=rcolor, symbol=symbol, size=14,
                                                     line=dict(color=color, width=2)),
                                         hovertemplate=f"{run.label}, class {name}<br>out tok/s=%{{x:.4g}}"
                                                       "<br>p99=%{y:.4g} s<extra></extra>"),
                              row=1, col=mi + 1)
    fig.update_yaxes(type="log", title_text="seconds (log)")
    fig.update_xaxes(title_text="output tokens/s")
    caption = ("p99 TTFT and p99 E2E of each class against throughput, one marker per trial; the lines join the "
               "Pareto-optimal trials, so reading along a line shows what each class pays for more throughput. "
               "Dashed: the class's SLO. Timed-out, cancelled and rejected requests count in the tail as censored "
               "values (at least their timeout), never dropped.")
    return Chart("class-tail", "Per-class p99 against throughput", caption, _layout(fig, 540))


def waste_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if not len(df) or "recompute_busy_share" not in df:
        return None
    names = _param_names(data)
    xparam = _main_numeric_param(data, names)
    cols = 2 if xparam else 1
    series = [("recompute_busy_share", "recompute busy share (%): busy time re-prefilling after preemption", FRONT_COLOR),
              ("new_token_busy_share", "new-token busy share (%): busy time on new prefill and decode", "#2ca02c")]
    titles = []
    for _, label, _ in series:
        short = label.split(":")[0]
        titles += [f"{short} per trial"] + ([f"{short} against {xparam}"] if xparam else [])
    fig = make_subplots(rows=2, cols=cols, subplot_titles=titles, horizontal_spacing=0.08, vertical_spacing=0.16)
    hover = _hover(data)
    xs = [("number", 1)] + ([(f"param.{xparam}", 2)] if xparam else [])
    for row, (key, label, color) in enumerate(series, start=1):
        for xcol, col in xs:
            order = df.sort_values(xcol) if xcol != "number" else df
            colors = [FRONT_COLOR if p else (color if f else INFEASIBLE_COLOR)
                      for p, f in zip(order["pareto"], order["feasible"])] if xcol != "number" else color
            fig.add_trace(go.Scatter(x=_compact(order[xcol]), y=_compact(100 * order[key].map(_finite), 6),
                                     name=label, legendgroup=key,
                                     showlegend=col == 1, mode="markers" if xcol != "number" else "lines+markers",
                                     line=dict(color=color, width=1), marker=dict(color=colors, size=8),
                                     customdata=hover.take(order.index),
                                     hovertemplate=hover.template + "<br>" + key + "=%{y:.3f}%<extra></extra>"),
                          row=row, col=col)
        for run, dash in ((data.default, "dot"), (data.recommended, "dash")):
            if run is None or not run.ok:
                continue
            value = 100 * _finite(run.metrics.get(key))
            if math.isnan(value):
                continue
            for _, col in xs:
                fig.add_hline(y=value, line=dict(color=DEFAULT_COLOR if dash == "dot" else RECOMMENDED_COLOR,
                                                 dash=dash, width=1.5), row=row, col=col)
            fig.add_annotation(x=1, xref="x domain", y=value, text=f"{run.label.split(' (')[0]} {value:.2f}%",
                               showarrow=False, xanchor="right", yanchor="bottom" if dash == "dot" else "top",
                               font=dict(size=11, color=DEFAULT_COLOR if dash == "dot" else "#b07400"),
                               row=row, col=1)
        fig.update_yaxes(title_text="%", row=row, col=1)
    fig.update_xaxes(title_text="trial", row=2, col=1)
    if xparam:
        dom = data.spec.search[xparam] if xparam in data.spec.search.names else None
        fig.update_xaxes(title_text=xparam, type="log" if dom is not None and dom.log else None, col=2)
    caption = ("Of what the GPU processed, how much was new work, per trial and against "
               f"{xparam or 'the trial number'}. Recompute share: prefill tokens replayed because of preemption over "
               "all tokens processed; new-token busy share: busy GPU time attributed to new tokens (the rest "
               "re-processed tokens it had already processed). Dotted: the default config; dashed: the recommended "
               "one; red markers: Pareto-optimal trials, grey: trials missing an SLO.")
    return Chart("waste", "Recompute share and new-token busy share", caption, _layout(fig, 700))


def _main_numeric_param(data: ReportData, names: Sequence[str]) -> str | None:
    """``max_num_seqs`` when searched (the incident's knob), else the first numeric parameter searched."""
    numeric = []
    for name in names:
        col = data.trials.get(f"param.{name}")
        if col is not None and pd.api.types.is_numeric_dtype(col) and col.nunique() > 1:
            numeric.append(name)
    if "max_num_seqs" in numeric:
        return "max_num_seqs"
    return numeric[0] if numeric else None
