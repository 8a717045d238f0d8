"""The building blocks every chart of the report shares: the :class:`Chart` record, the page's colours and
layout, the SLO line, and the helpers that turn ``ReportData`` values into labels and hover text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from optimizer.report._data import ReportData

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
DEFAULT_COLOR = "#222222"
RECOMMENDED_COLOR = "#f0a30a"
FRONT_COLOR = "#d62728"
TRIAL_COLOR = "#1f77b4"
INFEASIBLE_COLOR = "#b0b0b0"
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


def _rounded(values: pd.Series, digits: int = 4) -> list[float]:
    """Values rounded to ``digits`` significant digits: the page carries what the eye can read, not float64."""
    arr = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(np.isfinite(arr) & (arr != 0), 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(arr)))), 1.0)
    return (np.round(arr * scale) / scale).tolist()


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


def _sorted_by_params(trials: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """``trials`` ordered by the search parameters' columns (those it has), values of one type together."""
    sort_cols = [f"param.{n}" for n in names if f"param.{n}" in trials]
    if not sort_cols:
        return trials
    return trials.sort_values(sort_cols, key=lambda s: s.map(lambda v: (str(type(v)), v)))


@dataclass(frozen=True)
class TrialHover:
    """Each trial's hover as ``customdata`` rows (number, state, then one value per search parameter, "default"
    where the trial has none) and the ``template`` that lays them out: a parameter's name is written once per
    trace instead of once per trial and trace, which was most of what a per-trial chart weighs (issue 33: the
    page <= 1 MB)."""

    rows: list[list[Any]]
    template: str

    def take(self, index: Sequence[int]) -> list[list[Any]]:
        """The rows of these positions of ``data.trials``."""
        return [self.rows[i] for i in index]


def _hover_value(value: Any) -> Any:
    if not _present(value):
        return "default"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(f"{value:.4g}")
    return str(value)


def _hover(data: ReportData) -> TrialHover:
    """The hover of every row of ``data.trials``: ``hovertemplate=hover.template + ...`` with
    ``customdata=hover.rows`` (or ``hover.take(positions)``)."""
    names = _param_names(data)
    rows = []
    for _, row in data.trials.iterrows():
        flag = "Pareto" if row["pareto"] else ("feasible" if row["feasible"] else "misses an SLO")
        rows.append([int(row["number"]), flag, *(_hover_value(row.get(f"param.{n}")) for n in names)])
    template = "trial %{customdata[0]} (%{customdata[1]})" + "".join(
        f"<br>{name}=%{{customdata[{i + 2}]}}" for i, name in enumerate(names))
    return TrialHover(rows, template)


def _objective_value(data: ReportData, index: int, metrics: dict[str, float]) -> float:
    try:
        return _finite(data.ctx.objectives[index].value(metrics))
    except Exception:  # the run lacks the key (e.g. a failed default run): leave the marker out
        return math.nan


def _class_names(data: ReportData) -> list[str]:
    return list(data.ctx.classes)


def _config_label(row: dict, names: Sequence[str], number: int) -> str:
    params = ", ".join(f"{n}={_short(row.get(f'param.{n}'))}" for n in names if _present(row.get(f"param.{n}")))
    return f"#{number} {params}"


def _trial_number(label: str) -> int:
    digits = "".join(ch if ch.isdigit() else " " for ch in label).split()
    return int(digits[0]) if digits else -1
