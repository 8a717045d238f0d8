"""The report's charts (plotly figures), each built from ``ReportData`` alone.

Every chart function returns ``None`` when the study has nothing to show for it (e.g. no what-if was asked for),
so the page lists only charts that carry data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._data import ConfigRun, ReportData

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
DEFAULT_COLOR = "#222222"
RECOMMENDED_COLOR = "#f0a30a"
FRONT_COLOR = "#d62728"
TRIAL_COLOR = "#1f77b4"
INFEASIBLE_COLOR = "#b0b0b0"
#: Time bins of a timeline chart (the step table is sampled at bin centres; preemptions summed per bin).
TIMELINE_BINS = 400
#: Most trials the per-trial heatmap lists one by one (beyond it: the Pareto front only).
HEATMAP_MAX_ROWS = 60
_LAYOUT = dict(template="plotly_white", font=dict(size=12), margin=dict(l=70, r=30, t=100, b=60),
               legend=dict(orientation="h", yanchor="top", y=0.995, xanchor="left", x=0, yref="container"))


@dataclass
class Chart:
    """One chart of the page: its id (also the PNG file name), title, caption and figure."""

    id: str
    title: str
    caption: str
    figure: go.Figure

    @property
    def height(self) -> int:
        return int(self.figure.layout.height or 520)


def _layout(fig: go.Figure, height: int, **extra: Any) -> go.Figure:
    fig.update_layout(height=height, **{**_LAYOUT, **extra})
    return fig


def _slo_line(fig: go.Figure, y: float, text: str, color: str, *, row: int | None, col: int | None,
              log: bool) -> None:
    """A dashed horizontal line at ``y`` with a label; on a log axis the label's position is given in log10 units
    (plotly places annotations on log axes by the exponent, shapes by the value)."""
    where = {} if row is None else {"row": row, "col": col}
    fig.add_hline(y=y, line=dict(color=color, dash="dash", width=1), **where)
    fig.add_annotation(x=0, xref="x domain", y=math.log10(y) if log else y, text=text, showarrow=False,
                       xanchor="left", yanchor="bottom", font=dict(color=color, size=11), **where)


def _finite(value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def _fmt(value: Any, digits: int = 3) -> str:
    value = _finite(value)
    return "-" if math.isnan(value) else f"{value:.{digits}g}"


def _params_text(row: pd.Series, names: Sequence[str]) -> str:
    parts = []
    for name in names:
        value = row.get(f"param.{name}")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        parts.append(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    return "<br>".join(parts)


def _param_names(data: ReportData) -> list[str]:
    return [c[len("param."):] for c in data.trials.columns if c.startswith("param.")]


def _hover(data: ReportData) -> list[str]:
    names = _param_names(data)
    out = []
    for _, row in data.trials.iterrows():
        flag = "Pareto" if row["pareto"] else ("feasible" if row["feasible"] else "misses an SLO")
        out.append(f"trial {int(row['number'])} ({flag})<br>{_params_text(row, names)}")
    return out


def _objective_value(data: ReportData, index: int, metrics: dict[str, float]) -> float:
    try:
        return _finite(data.ctx.objectives[index].value(metrics))
    except Exception:  # the run lacks the key (e.g. a failed default run): leave the marker out
        return math.nan


def _class_names(data: ReportData) -> list[str]:
    return list(data.ctx.classes)


# ---- 1. Pareto front -------------------------------------------------------------------------------------------
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
            fig.add_trace(go.Scatter(x=df.loc[mask, xcol], y=df.loc[mask, ycol], mode="markers", name=label,
                                     marker=dict(color=color, symbol=symbol, size=8, opacity=opacity),
                                     text=[hover[i] for i in np.flatnonzero(mask.to_numpy())],
                                     hovertemplate="%{text}<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
    front = df[df["pareto"]].sort_values(xcol)
    if len(front):
        fig.add_trace(go.Scatter(x=front[xcol], y=front[ycol], mode="lines+markers", name="Pareto front",
                                 line=dict(color=FRONT_COLOR, width=2), marker=dict(color=FRONT_COLOR, size=10),
                                 text=[hover[i] for i in front.index],
                                 hovertemplate="%{text}<br>x=%{x:.4g}<br>y=%{y:.4g}<extra></extra>"))
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


def _axis_label(data: ReportData, index: int) -> str:
    name = data.objective_names[index]
    direction = data.ctx.objectives[index].direction
    return f"{name} ({'higher' if direction == 'maximize' else 'lower'} is better)"


# ---- 2. per-class p99 against throughput -----------------------------------------------------------------------
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
            y = df[key].map(_finite)
            fig.add_trace(go.Scatter(x=df["output_tokens_per_s"], y=y, mode="markers", name=f"{name}: all trials",
                                     legendgroup=name, showlegend=mi == 0,
                                     marker=dict(color=color, size=6, opacity=0.35),
                                     text=hover, hovertemplate=f"class {name}<br>%{{text}}<br>"
                                                               "out tok/s=%{x:.4g}<br>p99=%{y:.4g} s<extra></extra>"),
                          row=1, col=mi + 1)
            if len(front):
                fig.add_trace(go.Scatter(x=front["output_tokens_per_s"], y=front[key].map(_finite),
                                         mode="lines+markers", name=f"{name}: Pareto front", legendgroup=name,
                                         showlegend=mi == 0, line=dict(color=color, width=2),
                                         marker=dict(color=color, size=9),
                                         text=[hover[i] for i in front.index],
                                         hovertemplate=f"class {name} (Pareto)<br>%{{text}}<br>out tok/s=%{{x:.4g}}"
                                                       "<br>p99=%{y:.4g} s<extra></extra>"),
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


# ---- 3. recompute share and new-token busy share ---------------------------------------------------------------
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
            fig.add_trace(go.Scatter(x=order[xcol], y=100 * order[key].map(_finite), name=label, legendgroup=key,
                                     showlegend=col == 1, mode="markers" if xcol != "number" else "lines+markers",
                                     line=dict(color=color, width=1), marker=dict(color=colors, size=8),
                                     text=[hover[i] for i in order.index],
                                     hovertemplate="%{text}<br>" + key + "=%{y:.3f}%<extra></extra>"),
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


# ---- 4. timeline -----------------------------------------------------------------------------------------------
#: Busy-time parts of the timeline (step table ``time_<part>_s``), with their colours.
PART_COLORS = (("prefill_new", "new prefill", "#1f77b4"), ("recompute", "recompute", "#d62728"),
               ("decode", "decode", "#2ca02c"), ("transfer", "KV transfer", "#8c564b"),
               ("overhead", "fixed overhead", "#b0b0b0"))


def _busy_per_bin(start: np.ndarray, duration: np.ndarray, weight: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Seconds of ``weight * duration`` falling in each bin, steps spread over the bins they overlap (steps do
    not overlap each other and are sorted by start): the difference of the cumulative busy function at the edges."""
    cum = np.concatenate(([0.0], np.cumsum(weight * duration)))
    k = np.searchsorted(start, edges, side="right") - 1  # the last step starting at or before each edge
    inside = np.where(k >= 0, np.minimum(edges - start[np.maximum(k, 0)], duration[np.maximum(k, 0)]), 0.0)
    at_edge = np.where(k >= 0, cum[np.maximum(k, 0)] + weight[np.maximum(k, 0)] * np.maximum(inside, 0.0), 0.0)
    return np.diff(at_edge)


def timeline_frame(steps: pd.DataFrame, bins: int = TIMELINE_BINS) -> pd.DataFrame:
    """The step table sampled at ``bins`` evenly spaced times: KV usage (%), running, waiting, swapped (the step
    active at each bin centre; idle time between steps keeps the last state), preemptions summed per bin, and
    the share of each bin the GPU was busy (``busy_pct``) split by what it served (``<part>_pct``, from the
    step table's ``time_<part>_s``; NaN without them)."""
    cols = ["t_s", "kv_used_pct", "num_running", "num_waiting", "num_swapped", "preemptions", "recompute_tokens",
            "busy_pct"] + [f"{p}_pct" for p, _, _ in PART_COLORS]
    if steps is None or not len(steps):
        return pd.DataFrame(columns=cols)
    start = steps["start_s"].to_numpy(dtype=float)
    duration = steps["duration_s"].to_numpy(dtype=float)
    end = float((start + duration).max())
    t0 = float(start.min())
    edges = np.linspace(t0, max(end, t0 + 1e-9), bins + 1)
    width = edges[1] - edges[0]
    centres = (edges[:-1] + edges[1:]) / 2
    idx = np.clip(np.searchsorted(start, centres, side="right") - 1, 0, len(steps) - 1)
    total = steps["kv_blocks_total"].to_numpy(dtype=float)
    used = steps["kv_blocks_used"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(total > 0, 100.0 * used / total, np.nan)
        parts = {}
        for part, _, _ in PART_COLORS:
            col = f"time_{part}_s"
            share = steps[col].to_numpy(dtype=float) / duration if col in steps else np.full(len(steps), np.nan)
            parts[f"{part}_pct"] = 100.0 * _busy_per_bin(start, duration, np.nan_to_num(np.where(duration > 0, share, 0.0)),
                                                          edges) / width
            if col not in steps:
                parts[f"{part}_pct"][:] = np.nan
    which = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, bins - 1)
    preempted = np.bincount(which, weights=steps["preempted"].to_numpy(dtype=float), minlength=bins)
    recompute = np.bincount(which, weights=steps["prefill_tokens_recompute"].to_numpy(dtype=float), minlength=bins)
    return pd.DataFrame({
        "t_s": centres,
        "kv_used_pct": pct[idx],
        "num_running": steps["num_running"].to_numpy()[idx],
        "num_waiting": steps["num_waiting"].to_numpy()[idx],
        "num_swapped": steps["num_swapped"].to_numpy()[idx],
        "preemptions": preempted,
        "recompute_tokens": recompute,
        "busy_pct": 100.0 * _busy_per_bin(start, duration, np.ones(len(steps)), edges) / width,
        **parts,
    })


def timeline_chart(data: ReportData) -> Chart | None:
    runs = [r for r in data.runs if r.ok and r.steps is not None and len(r.steps)]
    if not runs:
        return None
    rows = ("KV cache used (%)", "GPU busy (%) by what it served", "running / waiting requests", "preemptions per bin")
    titles = [f"{run.label}: {row_title}" for row_title in rows for run in runs]
    fig = make_subplots(rows=len(rows), cols=len(runs), shared_xaxes=True, shared_yaxes="rows", vertical_spacing=0.07,
                        horizontal_spacing=0.05, subplot_titles=titles)
    for col, run in enumerate(runs, start=1):
        tl = timeline_frame(run.steps)
        first = col == 1
        t = _rounded(tl["t_s"])
        fig.add_trace(go.Scatter(x=t, y=_rounded(tl["kv_used_pct"]), name="KV used %", legendgroup="kv",
                                 showlegend=first, line=dict(color="#9467bd", width=1.5),
                                 hovertemplate="t=%{x:.1f} s<br>KV used %{y:.1f}%<extra></extra>"), row=1, col=col)
        for part, label, color in PART_COLORS:
            values = tl[f"{part}_pct"]
            if values.isna().all() or not (values > 0).any():
                continue
            fig.add_trace(go.Scatter(x=t, y=_rounded(values), name=label, legendgroup=part, showlegend=first,
                                     stackgroup=f"busy{col}", line=dict(color=color, width=0.5), fillcolor=color,
                                     hovertemplate=f"t=%{{x:.1f}} s<br>{label} %{{y:.1f}}% of the time<extra></extra>"),
                          row=2, col=col)
        fig.add_trace(go.Scatter(x=t, y=_rounded(tl["busy_pct"]), name="GPU busy", legendgroup="busy",
                                 showlegend=first, line=dict(color="#222", width=1, dash="dot"),
                                 hovertemplate="t=%{x:.1f} s<br>busy %{y:.1f}%<extra></extra>"), row=2, col=col)
        fig.add_trace(go.Scatter(x=t, y=tl["num_running"], name="running", legendgroup="run",
                                 showlegend=first, line=dict(color="#2ca02c", width=1.5)), row=3, col=col)
        fig.add_trace(go.Scatter(x=t, y=tl["num_waiting"], name="waiting", legendgroup="wait",
                                 showlegend=first, line=dict(color="#ff7f0e", width=1.5)), row=3, col=col)
        if tl["num_swapped"].max() > 0:
            fig.add_trace(go.Scatter(x=t, y=tl["num_swapped"], name="swapped / offloaded",
                                     legendgroup="swap", showlegend=True, line=dict(color="#8c564b", width=1.5)),
                          row=3, col=col)
        fig.add_trace(go.Bar(x=t, y=tl["preemptions"], name="preemptions", legendgroup="pre",
                             showlegend=first, marker_color=FRONT_COLOR,
                             hovertemplate="t=%{x:.1f} s<br>%{y:.0f} preemptions<extra></extra>"), row=4, col=col)
        fig.update_xaxes(title_text="simulated time (s)", row=len(rows), col=col)
    fig.update_yaxes(range=[0, 102], row=1)
    fig.update_yaxes(range=[0, 102], row=2)
    fig.update_yaxes(autorange=True, rangemode="tozero", row=3)
    fig.update_yaxes(autorange=True, rangemode="tozero", row=4)
    caption = ("The default and the recommended config re-simulated on the study's workload (first replicate "
               "seed), from the engine's step table: KV blocks in use; the share of each time bin the GPU was "
               "stepping (dotted), stacked by what that time served (each step's duration split by the latency "
               "model's marginal costs: new prefill, recompute, decode, KV transfer, fixed overhead); running and "
               f"waiting requests; preemptions per bin ({TIMELINE_BINS} bins). \"GPU 100% busy\" with a red band is "
               "busy time spent re-prefilling preempted requests.")
    return Chart("timeline", "Timeline: KV usage, GPU busy time by what it served, queue and preemptions", caption,
                 _layout(fig, 980, bargap=0))


def _rounded(values: pd.Series, digits: int = 4) -> list[float]:
    """Values rounded to ``digits`` significant digits: the page carries what the eye can read, not float64."""
    arr = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(np.isfinite(arr) & (arr != 0), 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(arr)))), 1.0)
    return (np.round(arr * scale) / scale).tolist()


# ---- 4b. lifelines of the most preempted requests ---------------------------------------------------------------
LIFELINE_COLORS = {"queued": "#c7c7c7", "running": "#2ca02c", "preempted": "#ff7f0e", "recompute": "#d62728"}


def lifeline_chart(data: ReportData) -> Chart | None:
    runs = [r for r in data.runs if r.ok and r.lifelines]
    if not runs:
        return None
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{r.label}: the {len(r.lifelines)} most preempted requests" for r in runs])
    shown: set[str] = set()
    for row, run in enumerate(runs, start=1):
        labels = [line.label for line in run.lifelines]
        for kind, color in LIFELINE_COLORS.items():
            base, length, ys = [], [], []
            for line in run.lifelines:
                for k, lo, hi in line.segments:
                    if k == kind and hi == hi and lo == lo:
                        base.append(lo)
                        length.append(max(hi - lo, 0.0))
                        ys.append(line.label)
            if not ys:
                continue
            fig.add_trace(go.Bar(base=_rounded(base), x=_rounded(length), y=ys, orientation="h", name=kind,
                                 legendgroup=kind, showlegend=kind not in shown, marker_color=color,
                                 width=0.35 if kind == "recompute" else 0.7,
                                 hovertemplate=f"{kind} from %{{base:.1f}} s for %{{x:.2f}} s<extra>%{{y}}</extra>"),
                          row=row, col=1)
            shown.add(kind)
        px = [t for line in run.lifelines for t in line.preempt_s]
        py = [line.label for line in run.lifelines for _ in line.preempt_s]
        fig.add_trace(go.Scatter(x=_rounded(px), y=py, mode="markers", name="preemption", legendgroup="pre",
                                 showlegend=row == 1, marker=dict(symbol="x", color="#000", size=7),
                                 hovertemplate="preempted at %{x:.1f} s<extra>%{y}</extra>"), row=row, col=1)
        ft = [(line.first_token_s, line.label) for line in run.lifelines if line.first_token_s == line.first_token_s]
        fig.add_trace(go.Scatter(x=_rounded([t for t, _ in ft]), y=[y for _, y in ft], mode="markers",
                                 name="first token", legendgroup="ft", showlegend=row == 1,
                                 marker=dict(symbol="diamond", color="#1f77b4", size=7),
                                 hovertemplate="first token at %{x:.1f} s<extra>%{y}</extra>"), row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], automargin=True, row=row, col=1)
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="simulated time (s)", row=len(runs), col=1)
    caption = ("Each row is one request, from arrival to its end: queued before it was first scheduled (grey), "
               "running (green), preempted and waiting to be scheduled again (orange), re-prefilling what it had "
               "computed (red, thin), preemptions (x) and the first token (diamond). Read whether the victims are "
               "long requests or the newest admissions, and whether the loss is waiting or recompute.")
    return Chart("lifelines", "Lifelines of the most preempted requests", caption,
                 _layout(fig, 260 + 230 * len(runs), barmode="overlay"))


# ---- 5. tail by cohort -----------------------------------------------------------------------------------------
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


# ---- 6. p99 by cohort for every trial --------------------------------------------------------------------------
def cohort_heatmap_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if len(df) < 2:
        return None
    rows = df if len(df) <= HEATMAP_MAX_ROWS else df[df["pareto"]]
    if not len(rows):
        return None
    names = _param_names(data)
    sort_cols = [f"param.{n}" for n in names if f"param.{n}" in rows]
    if sort_cols:
        rows = rows.sort_values(sort_cols, key=lambda s: s.map(lambda v: (str(type(v)), v)))
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


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _log_ticks(lo: float, hi: float) -> list[float]:
    out = []
    for exp in range(int(math.floor(lo)) - 1, int(math.ceil(hi)) + 1):
        for mult in (1, 2, 5):
            v = mult * 10.0 ** exp
            if lo - 1e-9 <= math.log10(v) <= hi + 1e-9:
                out.append(v)
    return out or [10 ** lo]


# ---- 7. what-ifs -----------------------------------------------------------------------------------------------
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


def whatif_grid_chart(data: ReportData) -> Chart | None:
    """For ``--whatif-trials all``: p99 E2E by cohort of every trial config, one panel per scenario."""
    grids = [(w, runs) for w, runs in data.whatifs if any(r.label.startswith("trial ") for r in runs)]
    if not grids or not len(data.trials):
        return None
    names = _param_names(data)
    classes = _class_names(data)
    scenarios: list[tuple[str, list[tuple[str, dict[str, float]]]]] = []
    base = []
    ordered = data.trials
    sort_cols = [f"param.{n}" for n in names if f"param.{n}" in ordered]
    if sort_cols:
        ordered = ordered.sort_values(sort_cols, key=lambda s: s.map(lambda v: (str(type(v)), v)))
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
    grids = [(w, runs) for w, runs in data.whatifs if any(r.label.startswith("trial ") for r in runs)]
    if not grids or not len(data.trials):
        return None
    names = _param_names(data)
    ordered = data.trials
    sort_cols = [f"param.{n}" for n in names if f"param.{n}" in ordered]
    if sort_cols:
        ordered = ordered.sort_values(sort_cols, key=lambda s: s.map(lambda v: (str(type(v)), v)))
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


def _trial_number(label: str) -> int:
    digits = "".join(ch if ch.isdigit() else " " for ch in label).split()
    return int(digits[0]) if digits else -1


def _config_label(row: dict, names: Sequence[str], number: int) -> str:
    params = ", ".join(f"{n}={_short(row.get(f'param.{n}'))}" for n in names if _present(row.get(f"param.{n}")))
    return f"#{number} {params}"


# ---- 8. one-knob sweeps ---------------------------------------------------------------------------------------
def sweep_charts(data: ReportData) -> list[Chart]:
    out = []
    for sweep, by_base in data.sweeps:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in sweep.values)
        log = numeric and min(sweep.values) > 0 and max(sweep.values) / min(sweep.values) >= 8
        xs = list(sweep.values) if numeric else [str(v) for v in sweep.values]
        titles = ["recompute share (%)", "new-token busy share (%)", "p99 E2E by class (s, censored)",
                  "output tokens/s", "timed out + cancelled + rejected", "preemptions per request (mean)"]
        fig = make_subplots(rows=3, cols=2, subplot_titles=titles, vertical_spacing=0.12, horizontal_spacing=0.08)
        for base, runs in by_base.items():
            dash = "solid" if base == "default" else "dash"
            bcolor = DEFAULT_COLOR if base == "default" else RECOMMENDED_COLOR
            ok = [(x, r) for x, r in zip(xs, runs) if r.ok]
            if not ok:
                continue
            rx = [x for x, _ in ok]

            def line(values, row, col, name, color, legend, group):
                fig.add_trace(go.Scatter(x=rx, y=values, mode="lines+markers", name=name, legendgroup=group,
                                         showlegend=legend, line=dict(color=color, dash=dash, width=2),
                                         marker=dict(color=color, size=8),
                                         hovertemplate=f"{name}<br>{sweep.knob}=%{{x}}<br>%{{y:.4g}}<extra></extra>"),
                              row=row, col=col)

            line([100 * _finite(r.metrics.get("recompute_busy_share")) for _, r in ok], 1, 1, f"{base} config", bcolor,
                 True, base)
            line([100 * _finite(r.metrics.get("new_token_busy_share")) for _, r in ok], 1, 2, f"{base} config",
                 bcolor, False, base)
            for ci, cname in enumerate(_class_names(data)):
                color = PALETTE[ci % len(PALETTE)]
                line([_finite(r.metrics.get(f"class.{cname}.e2e_s.p99")) for _, r in ok], 2, 1,
                     f"{base}: class {cname}", color, True, f"{base}-{cname}")
            line([_finite(r.metrics.get("output_tokens_per_s")) for _, r in ok], 2, 2, f"{base} config", bcolor,
                 False, base)
            lost = [sum(_finite(r.metrics.get(f"all.count.{k}")) or 0 for k in ("timed_out", "cancelled", "rejected"))
                    for _, r in ok]
            line(lost, 3, 1, f"{base} config", bcolor, False, base)
            line([_finite(r.metrics.get("preemptions_per_request.mean")) for _, r in ok], 3, 2, f"{base} config",
                 bcolor, False, base)
        for cname, cls in data.ctx.classes.items():
            target = cls.slo.targets().get("e2e_s")
            if target is not None:
                _slo_line(fig, target, f"{cname} SLO {target:g} s", "#555", row=2, col=1, log=False)
        fig.update_xaxes(title_text=sweep.knob, type="log" if log else None)
        fig.update_yaxes(rangemode="tozero")
        caption = (f"{sweep.knob} set to each of {', '.join(str(v) for v in sweep.values)} on top of the default "
                   "config (solid) and the recommended config (dashed), everything else unchanged, each simulated "
                   "on the study's workload. Rising recompute share and falling new-token busy share with "
                   f"{sweep.knob} is the repeated-preemption loop.")
        out.append(Chart(f"sweep-{sweep.knob}", f"Sweep of {sweep.knob}", caption, _layout(fig, 860)))
    return out


#: Chart builders in page order.
CHARTS = (pareto_chart, class_tail_chart, waste_chart, timeline_chart, lifeline_chart, cohort_chart,
          cohort_heatmap_chart, whatif_chart, whatif_grid_chart, whatif_throughput_chart)


def build_charts(data: ReportData) -> list[Chart]:
    out = []
    for builder in CHARTS:
        chart = builder(data)
        if chart is not None:
            out.append(chart)
        if builder is waste_chart:
            out.extend(sweep_charts(data))
    return out

