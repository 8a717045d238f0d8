"""The report's charts (plotly figures), each built from ``ReportData`` alone: this module lists them in page order
(:data:`CHARTS`, :func:`build_charts`); each family lives in a module of its own.

- ``_chart_base``: :class:`Chart`, the colours and layout, shared helpers;
- ``_figures_trials``: the trials in objective space (Pareto front, per-class p99 against throughput, recompute
  and new-token busy shares per trial);
- ``_figures_cost``: each trial's cost against the share of the SLOs it meets, the default and the pick marked;
- ``_figures_timeline``: the default and recommended configs' step tables over time;
- ``_figures_requests``: per-request lifelines;
- ``_figures_cohorts``: tail latency by cohort (both configs, and the heatmap of every trial);
- ``_figures_whatif``: what-ifs (other hardware, knob values, request rates);
- ``_figures_sweeps``: one-knob sweeps.

Every chart function returns ``None`` when the study has nothing to show for it (e.g. no what-if was asked for),
so the page lists only charts that carry data.
"""

from __future__ import annotations

from optimizer.report._chart_base import (
    DEFAULT_COLOR, FRONT_COLOR, INFEASIBLE_COLOR, PALETTE, RECOMMENDED_COLOR, TRIAL_COLOR, Chart,
)
from optimizer.report._data import ReportData
from optimizer.report._figures_cost import cost_chart
from optimizer.report._figures_cohorts import (
    COHORT_GROUPS, HEATMAP_MAX_ROWS, cohort_chart, cohort_heatmap_chart, cohort_labels,
)
from optimizer.report._figures_requests import LIFELINE_COLORS, lifeline_chart
from optimizer.report._figures_sweeps import sweep_charts
from optimizer.report._figures_timeline import PART_COLORS, TIMELINE_BINS, timeline_chart, timeline_frame
from optimizer.report._figures_trials import class_tail_chart, pareto_chart, waste_chart
from optimizer.report._figures_whatif import whatif_chart, whatif_grid_chart, whatif_rows, whatif_throughput_chart

__all__ = [
    "CHARTS", "COHORT_GROUPS", "Chart", "DEFAULT_COLOR", "FRONT_COLOR", "HEATMAP_MAX_ROWS", "INFEASIBLE_COLOR",
    "LIFELINE_COLORS", "PALETTE", "PART_COLORS", "RECOMMENDED_COLOR", "TIMELINE_BINS", "TRIAL_COLOR",
    "build_charts", "class_tail_chart", "cohort_chart", "cohort_heatmap_chart", "cohort_labels", "cost_chart",
    "lifeline_chart", "pareto_chart", "sweep_charts", "timeline_chart", "timeline_frame", "waste_chart", "whatif_chart",
    "whatif_grid_chart", "whatif_rows", "whatif_throughput_chart",
]

#: Chart builders in page order (the sweeps follow the waste chart, see :func:`build_charts`).
CHARTS = (pareto_chart, cost_chart, class_tail_chart, waste_chart, timeline_chart, lifeline_chart, cohort_chart,
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
