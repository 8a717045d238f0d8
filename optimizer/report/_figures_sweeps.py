"""One-knob sweep charts: a knob set to each of its values on top of the default and recommended configs
(``kvtune report --sweep``).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from optimizer.report._chart_base import (
    DEFAULT_COLOR, PALETTE, RECOMMENDED_COLOR, Chart, _class_names, _finite, _layout, _slo_line,
)
from optimizer.report._data import ReportData


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
