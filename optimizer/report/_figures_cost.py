"""The cost chart: each trial's cost against the share of the study's SLOs it meets, the default and the
recommended trials marked (issue 30: "the report shows cost against SLO attainment, and marks the default").

The cost is the study's first cost objective when it has one (what the pick minimizes), else USD per million
output tokens (the deployment's price over its throughput: it separates trials on the same hardware, where the
price per hour is one value).  Both come from the price each trial stored (``objectives.PRICE_KEY``, the device's
list price x its GPUs) and its stored ``output_tokens_per_s``; a trial whose device has no price is not drawn,
and the caption counts it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from objectives import PRICE_KEY
from optimizer._spec import COST_OBJECTIVES
from optimizer.report._chart_base import (
    DEFAULT_COLOR, INFEASIBLE_COLOR, PALETTE, RECOMMENDED_COLOR, Chart, _finite, _layout, _rounded,
)
from optimizer.report._data import ReportData

#: Axis label and hover unit of each cost measure.
_COST_LABELS = {"cost_per_hour_usd": ("deployment price, USD per hour (lower is better)", "$/h"),
                "usd_per_million_output_tokens": ("USD per million output tokens (lower is better)", "$/Mtok")}


def cost_measure(data: ReportData) -> str:
    """The cost the chart plots: the study's first cost objective, else ``usd_per_million_output_tokens``."""
    for name in data.objective_names:
        if name.split(":")[0] in COST_OBJECTIVES:
            return name.split(":")[0]
    return "usd_per_million_output_tokens"


def trial_cost(row: pd.Series | dict[str, Any], measure: str) -> float:
    """One trial's cost from its stored price (and throughput); NaN without a price, or without output."""
    price = _finite(row.get(PRICE_KEY))
    if math.isnan(price) or price <= 0:
        return math.nan
    if measure == "cost_per_hour_usd":
        return price
    rate = _finite(row.get("output_tokens_per_s"))
    return price / 3600.0 / rate * 1e6 if rate > 0 else math.nan


def _device(row: pd.Series, fallback: str) -> str:
    gpu = row.get("knob.gpu")
    return str(gpu) if isinstance(gpu, str) and gpu else fallback


def _hover_text(row: pd.Series, device: str, cost: float, unit: str) -> str:
    tags = [t for t, on in (("default", row["default"]), ("Pareto", row["pareto"])) if on]
    head = f"trial {int(row['number'])}" + (f" ({', '.join(tags)})" if tags else "")
    knobs = []
    for key in ("tensor_parallel_size", "replicas", "kv_cache_dtype", "quantization"):
        value = row.get(f"knob.{key}")
        if isinstance(value, float):
            value = None if math.isnan(value) else int(value) if value.is_integer() else value
        if value not in (None, "", "auto", 1):
            knobs.append(f"{key}={value}")
    lines = [head, " ".join([device, *knobs]), f"{cost:.4g} {unit}, ${_finite(row.get(PRICE_KEY)):.2f}/h",
             f"SLOs met {int(row['slo_met'])}/{int(row['slo_targets'])}"]
    if row.get("slo_missed"):
        lines.append(f"misses {row['slo_missed']}")
    return "<br>".join(lines)


def cost_chart(data: ReportData) -> Chart | None:
    df = data.trials
    if not len(df) or "slo_targets" not in df or not (df["slo_targets"] > 0).any():
        return None  # no trial, or a study without SLO constraints: nothing to attain
    measure = cost_measure(data)
    axis_label, unit = _COST_LABELS[measure]
    cost = pd.Series([trial_cost(row, measure) for _, row in df.iterrows()], index=df.index, dtype=float)
    drawn = df[cost.notna()]
    if not len(drawn):
        return None  # gather() notes on the page that no trial's device has a price
    attained = 100.0 * df["slo_met"] / df["slo_targets"].where(df["slo_targets"] > 0)
    devices = pd.Series([_device(row, data.spec.gpu) for _, row in df.iterrows()], index=df.index)
    # Devices side by side around each share (a dodge of a few points), so that one device's trials do not hide
    # another's; the share itself is each point's customdata and its hover.
    order = list(dict.fromkeys(devices[drawn.index]))
    step = min(3.0, 12.0 / len(order))
    dodge = {d: (k - (len(order) - 1) / 2) * step for k, d in enumerate(order)}
    x = attained + devices.map(dodge).astype(float)
    fig = go.Figure()

    def scatter(rows: pd.DataFrame, name: str, marker: dict, prefix: str = "") -> go.Scatter:
        return go.Scatter(x=_rounded(x[rows.index]), y=cost[rows.index].tolist(), mode="markers", name=name,
                          customdata=_rounded(attained[rows.index]), marker=marker,
                          text=[_hover_text(row, devices[j], cost[j], unit) for j, row in rows.iterrows()],
                          hovertemplate=prefix + "%{text}<extra></extra>")

    for i, device in enumerate(order):
        rows = drawn[devices[drawn.index] == device]
        meets = rows["feasible"].astype(bool)
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(scatter(rows, device, dict(color=[color if m else INFEASIBLE_COLOR for m in meets],
                                                 line=dict(color=color, width=1.5), size=9, opacity=0.75,
                                                 symbol=["circle" if m else "circle-open" for m in meets])))
    marks = [("engine default config", drawn[drawn["default"].astype(bool)], DEFAULT_COLOR, "diamond", 16)]
    if data.pick is not None:
        picked = drawn[drawn["number"] == data.pick.trial.number]
        marks.append((f"recommended (trial {data.pick.trial.number})", picked, RECOMMENDED_COLOR, "star", 20))
    for name, rows, color, symbol, size in marks:
        if len(rows):
            fig.add_trace(scatter(rows, name, dict(color=color, symbol=symbol, size=size,
                                                   line=dict(color="black", width=1)), prefix=f"{name}<br>"))
    targets = sorted(set(int(n) for n in df["slo_targets"] if n > 0))
    ticks = sorted({round(100.0 * k / n, 1) for n in targets for k in range(n + 1)})
    positive = cost[cost > 0]
    log = len(positive) > 1 and positive.max() / positive.min() > 20
    fig.update_xaxes(title_text="SLOs met (% of the study's SLO targets)", range=[-12, 112], tickvals=ticks,
                     ticktext=[f"{t:g}%" for t in ticks], showgrid=False)
    fig.update_yaxes(title_text=axis_label + (" (log)" if log else ""), type="log" if log else None)
    defaults = [str(int(n)) for n in df.loc[df["default"].astype(bool), "number"]]
    study_cost = measure in [n.split(":")[0] for n in data.objective_names]
    caption = (f"Each trial's cost ({unit}) against the share of the study's SLO targets it meets "
               f"({'/'.join(str(n) for n in targets)} target{'s' if targets != [1] else ''}). A class's p99 "
               "target either holds or not, so this counts the promises a config keeps: the 100% column holds "
               "every config kvtune may recommend and its lowest point is the cheapest of them; hover a point for "
               "the SLOs it misses. Filled: meets every SLO; open: misses one; colour: the device, its trials "
               "set side by side around each share. "
               + (f"Diamond: the engine's default config (trial {', '.join(defaults)}). " if defaults else
                  "The study stored no default trial. ")
               + ("Star: the recommended config. " if data.pick is not None else "")
               + (f"Cost: {measure}, the study's cost objective. " if study_cost else
                  "Cost: USD per million output tokens, the deployment's list price over the trial's throughput "
                  "(the price per hour alone is one value per deployment). "))
    missing = df[cost.isna()]
    if len(missing):
        no_price = [j for j in missing.index if math.isnan(_finite(missing.at[j, PRICE_KEY]))
                    or _finite(missing.at[j, PRICE_KEY]) <= 0] if PRICE_KEY in df else list(missing.index)
        caption += (f"Not drawn: {len(missing)} of {len(df)} complete trials"
                    + (f", {len(no_price)} of them on a device without a price "
                       f"({', '.join(sorted(set(devices[no_price])))})" if no_price else "")
                    + (f", {len(missing) - len(no_price)} without output tokens" if len(missing) > len(no_price)
                       else "")
                    + ("; the default config is among them" if missing["default"].astype(bool).any() else "")
                    + ". An unknown price is not counted as free.")
    else:
        caption += f"All {len(df)} complete trials are drawn."
    return Chart("cost", "Cost against SLO attainment", caption, _layout(fig, 500))
