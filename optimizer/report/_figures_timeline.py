"""The timeline chart: the default and recommended configs' step tables over simulated time (KV usage, GPU
busy time by what it served, the queue, preemptions), binned to a few hundred points.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import FRONT_COLOR, Chart, _layout, _rounded
from optimizer.report._data import ReportData

#: Time bins of a timeline chart (the step table is sampled at bin centres; preemptions summed per bin).
TIMELINE_BINS = 400
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


def _time_axis(t_s: pd.Series) -> dict:
    """A trace's x for the bin centres ``t_s``: ``x0`` and ``dx`` when they are evenly spaced (as
    :func:`timeline_frame` makes them), else the values rounded to 4 digits."""
    t = np.asarray(t_s, dtype=float)
    if len(t) >= 2:
        dx = float(t[1] - t[0])
        if dx > 0 and np.allclose(np.diff(t), dx, rtol=1e-6, atol=0.0):
            return {"x0": float(t[0]), "dx": dx}
    return {"x": _rounded(t_s)}


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
        # The bins are evenly spaced: every trace gives its x as the first centre and the step (x0, dx) rather
        # than 400 times again (issue 33: the page <= 1 MB).
        t = _time_axis(tl["t_s"])
        fig.add_trace(go.Scatter(**t, y=_rounded(tl["kv_used_pct"]), name="KV used %", legendgroup="kv",
                                 showlegend=first, line=dict(color="#9467bd", width=1.5),
                                 hovertemplate="t=%{x:.1f} s<br>KV used %{y:.1f}%<extra></extra>"), row=1, col=col)
        for part, label, color in PART_COLORS:
            values = tl[f"{part}_pct"]
            if values.isna().all() or not (values > 0).any():
                continue
            fig.add_trace(go.Scatter(**t, y=_rounded(values), name=label, legendgroup=part, showlegend=first,
                                     stackgroup=f"busy{col}", line=dict(color=color, width=0.5), fillcolor=color,
                                     hovertemplate=f"t=%{{x:.1f}} s<br>{label} %{{y:.1f}}% of the time<extra></extra>"),
                          row=2, col=col)
        fig.add_trace(go.Scatter(**t, y=_rounded(tl["busy_pct"]), name="GPU busy", legendgroup="busy",
                                 showlegend=first, line=dict(color="#222", width=1, dash="dot"),
                                 hovertemplate="t=%{x:.1f} s<br>busy %{y:.1f}%<extra></extra>"), row=2, col=col)
        fig.add_trace(go.Scatter(**t, y=tl["num_running"], name="running", legendgroup="run",
                                 showlegend=first, line=dict(color="#2ca02c", width=1.5)), row=3, col=col)
        fig.add_trace(go.Scatter(**t, y=tl["num_waiting"], name="waiting", legendgroup="wait",
                                 showlegend=first, line=dict(color="#ff7f0e", width=1.5)), row=3, col=col)
        if tl["num_swapped"].max() > 0:
            fig.add_trace(go.Scatter(**t, y=tl["num_swapped"], name="swapped / offloaded",
                                     legendgroup="swap", showlegend=True, line=dict(color="#8c564b", width=1.5)),
                          row=3, col=col)
        fig.add_trace(go.Bar(**t, y=tl["preemptions"], name="preemptions", legendgroup="pre",
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
