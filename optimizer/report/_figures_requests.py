"""Per-request charts: the lifelines of the most preempted requests of the default and recommended configs.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import Chart, _layout, _rounded
from optimizer.report._data import ReportData

LIFELINE_COLORS = {"queued": "#c7c7c7", "running": "#2ca02c", "preempted": "#ff7f0e", "recompute": "#d62728"}


def lifeline_chart(data: ReportData) -> Chart | None:
    runs = [r for r in data.runs if r.ok and r.lifelines]
    if not runs:
        return None
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{r.label}: the {len(r.lifelines)} most preempted requests" for r in runs])
    shown: set[str] = set()
    for row, run in enumerate(runs, start=1):
        # Each request is a row of the y axis by its position (0, the most preempted, at the top) with its label
        # as the tick text, and the hover names it by id: the ~50-character label was written once per segment,
        # most of what the chart weighed (issue 33: the page <= 1 MB).
        labels = [line.label for line in run.lifelines]
        for kind, color in LIFELINE_COLORS.items():
            base, length, ys, ids = [], [], [], []
            for i, line in enumerate(run.lifelines):
                for k, lo, hi in line.segments:
                    if k == kind and hi == hi and lo == lo:
                        base.append(lo)
                        length.append(max(hi - lo, 0.0))
                        ys.append(i)
                        ids.append(line.request_id)
            if not ys:
                continue
            fig.add_trace(go.Bar(base=_rounded(base), x=_rounded(length), y=ys, customdata=ids, orientation="h",
                                 name=kind, legendgroup=kind, showlegend=kind not in shown, marker_color=color,
                                 width=0.35 if kind == "recompute" else 0.7,
                                 hovertemplate=f"{kind} from %{{base:.1f}} s for %{{x:.2f}} s"
                                               "<extra>request #%{customdata}</extra>"),
                          row=row, col=1)
            shown.add(kind)
        px = [t for line in run.lifelines for t in line.preempt_s]
        py = [i for i, line in enumerate(run.lifelines) for _ in line.preempt_s]
        pid = [line.request_id for line in run.lifelines for _ in line.preempt_s]
        fig.add_trace(go.Scatter(x=_rounded(px), y=py, customdata=pid, mode="markers", name="preemption",
                                 legendgroup="pre", showlegend=row == 1, marker=dict(symbol="x", color="#000", size=7),
                                 hovertemplate="preempted at %{x:.1f} s<extra>request #%{customdata}</extra>"),
                      row=row, col=1)
        ft = [(line.first_token_s, i, line.request_id) for i, line in enumerate(run.lifelines)
              if line.first_token_s == line.first_token_s]
        fig.add_trace(go.Scatter(x=_rounded([t for t, _, _ in ft]), y=[i for _, i, _ in ft],
                                 customdata=[rid for _, _, rid in ft], mode="markers",
                                 name="first token", legendgroup="ft", showlegend=row == 1,
                                 marker=dict(symbol="diamond", color="#1f77b4", size=7),
                                 hovertemplate="first token at %{x:.1f} s<extra>request #%{customdata}</extra>"),
                      row=row, col=1)
        fig.update_yaxes(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
                         range=[len(labels) - 0.5, -0.5], zeroline=False, automargin=True,
                         row=row, col=1)
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="simulated time (s)", row=len(runs), col=1)
    caption = ("Each row is one request, from arrival to its end: queued before it was first scheduled (grey), "
               "running (green), preempted and waiting to be scheduled again (orange), re-prefilling what it had "
               "computed (red, thin), preemptions (x) and the first token (diamond). Read whether the victims are "
               "long requests or the newest admissions, and whether the loss is waiting or recompute.")
    return Chart("lifelines", "Lifelines of the most preempted requests", caption,
                 _layout(fig, 260 + 230 * len(runs), barmode="overlay"))
