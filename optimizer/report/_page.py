"""The report page: one self-contained HTML file with the answer first (default vs recommended, per class), then
the charts, then the tables behind them.

Light to open: plotly.js is inlined once, gzip-compressed (base64; the browser inflates it with
``DecompressionStream``, Chromium 80+, Firefox 113+, Safari 16.4+), so the file still opens offline. It is
plotly.js's "cartesian" partial bundle (vendor/README.md: 0.66 MB packed, against 1.96 MB for the full 4.8 MB
bundle), which draws every chart of the report; each chart is its figure's JSON without the layout template, which
the page carries once; timelines are sampled to a few hundred points and their values rounded to 4 significant
digits.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import html
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import plotly
import plotly.io as pio

from optimizer._export import describe_comparison, side_by_side
from optimizer._storage import trial_metrics
from optimizer.report._data import ConfigRun, ReportData
from optimizer.quality import format_quality_notes, quality_notes
from optimizer.report._figures import Chart, whatif_rows

_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;color:#222;
background:#fafafa}
main{max-width:1360px;margin:0 auto;padding:24px 32px 64px;box-sizing:border-box}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:36px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}
.question{font-size:15px;background:#fff;border-left:4px solid #f0a30a;padding:10px 14px;margin:12px 0;white-space:pre-wrap}
table{border-collapse:collapse;margin:8px 0 16px;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f0f0f0}td.l,th.l{text-align:left}
.better{color:#1a7f37;font-weight:600}.worse{color:#b42318;font-weight:600}
.chart{background:#fff;border:1px solid #e3e3e3;border-radius:4px;padding:8px;margin:12px 0 4px;box-sizing:border-box;overflow:hidden}
table{max-width:100%}
.caption{font-size:13px;color:#555;margin:4px 2px 20px}
.note{background:#fff8e1;border:1px solid #f0d58a;padding:8px 12px;margin:8px 0;font-size:13px}
.note pre{white-space:pre-wrap;margin:6px 0 0;font-size:12px}
.facts td{text-align:left}.facts th{text-align:left;width:220px}
code{background:#f0f0f0;padding:1px 4px;border-radius:3px}
"""


#: Collects script errors of the page, so a headless browser (and a curious reader) can tell that it rendered.
_ERRORS_JS = ("window.kvtuneErrors=[];window.addEventListener('error',function(e){"
              "window.kvtuneErrors.push(String(e.message||e));});")
#: Inflates plotly.js, draws every chart, then marks ``<body data-plots=N data-errors=M>`` (plotly charts drawn,
#: script errors seen).
_RENDER_JS = """
(async function(){
  var b=document.body;
  try{
    var raw=atob(document.getElementById('kvtune-plotlyjs').textContent.trim());
    var bytes=new Uint8Array(raw.length);for(var i=0;i<raw.length;i++){bytes[i]=raw.charCodeAt(i);}
    var code=await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
    var s=document.createElement('script');s.text=code;document.head.appendChild(s);
    var template=JSON.parse(document.getElementById('kvtune-template').textContent);
    var figs=document.querySelectorAll('script.kvtune-figure');
    for(var j=0;j<figs.length;j++){
      var fig=JSON.parse(figs[j].textContent);fig.layout=fig.layout||{};fig.layout.template=template;
      await Plotly.newPlot(figs[j].getAttribute('data-div'),fig.data,fig.layout,{displaylogo:false,responsive:true});
    }
  }catch(e){window.kvtuneErrors.push(String(e&&e.message||e));}
  b.setAttribute('data-plots',document.querySelectorAll('.js-plotly-plot .main-svg').length?
    document.querySelectorAll('.js-plotly-plot').length:0);
  b.setAttribute('data-errors',window.kvtuneErrors.length);
  if(window.kvtuneErrors.length){b.setAttribute('data-error-messages',window.kvtuneErrors.join(' | '));}
})();
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, digits: int = 4) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return _e(value) if value is not None else "-"
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3e}"
    if float(value).is_integer() and abs(value) < 1e6:
        return f"{int(value)}"
    return f"{value:.{digits}g}"


def _pct(value: Any) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(value) else f"{100 * value:.2f}%"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1, cls: str = "") -> str:
    head = "".join(f'<th class="l">{h}</th>' if i < left else f"<th>{h}</th>" for i, h in enumerate(header))
    body = []
    for row in rows:
        body.append("<tr>" + "".join(f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>"
                                     for i, c in enumerate(row)) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _change(default: float, recommended: float, lower_is_better: bool) -> str:
    try:
        d, r = float(default), float(recommended)
    except (TypeError, ValueError):
        return ""
    if any(math.isnan(v) or math.isinf(v) for v in (d, r)) or d == r:
        return ""
    if d == 0:
        better = (r < d) == lower_is_better
        return f'<span class="{"better" if better else "worse"}">{"+" if r > d else "-"}</span>'
    rel = (r - d) / abs(d)
    better = (rel < 0) == lower_is_better
    return f'<span class="{"better" if better else "worse"}">{100 * rel:+.1f}%</span>'


# ---- sections --------------------------------------------------------------------------------------------------
def _facts(data: ReportData) -> str:
    spec, ctx = data.spec, data.ctx
    wl = next(iter(ctx.workloads.values()))
    classes = []
    for name, cls in ctx.classes.items():
        n = int((wl.requests["class"] == name).sum())
        slo = ", ".join(f"p99 {k.replace('_s', '')} &le; {v:g} s" for k, v in cls.slo.targets().items()) or "no SLO"
        extra = f", timeout {cls.timeout_s:g} s" if cls.timeout_s else ""
        extra += f", cancels {100 * cls.cancel_probability:g}%" if cls.cancel_probability else ""
        classes.append(f"<b>{_e(name)}</b>: {n} requests; {slo}{extra}")
    counts = ", ".join(f"{v} {k}" for k, v in sorted(data.counts.items())) or "none"
    rows = [
        ("model / GPU", f"{_e(spec.model)} on {_e(spec.gpu)} (tensor parallel {spec.tensor_parallel_size})"),
        ("engine", f"{_e(spec.flavor)}, recommendation for vLLM {_e(spec.vllm_version)}"),
        ("workload", f"{len(wl)} requests over {wl.span_s:.0f} s from {_e(wl.source)}"
                     f"{' (replicate seeds ' + _e(ctx.seeds) + ')' if len(ctx.seeds) > 1 else ''}"),
        ("classes", "<br>".join(classes)),
        ("fixed knobs", _e(", ".join(f"{k}={v}" for k, v in spec.engine.items()) or "none (vLLM defaults)")),
        ("searched knobs", _e(", ".join(spec.search.names))),
        ("objectives", _e(", ".join(spec.objectives))),
        ("constraints", _e(", ".join(c.name for c in ctx.constraints) or "none")),
        ("trials", _e(counts)),
        ("storage", f"<code>{_e(data.storage)}</code>"),
    ]
    return _table(["", ""], rows, left=2, cls="facts").replace("<thead><tr><th class=\"l\"></th><th class=\"l\"></th></tr></thead>", "")


def _answer(data: ReportData) -> str:
    d, r = data.default, data.recommended
    parts = []
    if data.pick is not None:
        what = ("the engine's default config" if data.pick.keep_default else "")
        parts.append(f"<p>Recommended: <b>trial {data.pick.trial.number}</b>"
                     + (f" ({what}: keep the default)" if what else "") + f", picked by: {_e(data.pick.rule)}.</p>")
        parts.append(_quality_note(_picked_knobs(data)))
        if not data.pick.feasible:
            falls = "; ".join(str(s) for s in data.pick.shortfalls)
            parts.append(f'<div class="note">No trial meets every SLO. The recommendation misses: {_e(falls)}</div>')
            lines = describe_comparison(side_by_side(data.pick, None if data.pick.default is None else
                                                     trial_metrics(data.pick.default), data.ctx))
            if lines:
                parts.append("<p>The default and the trial closest to feasible, per SLO:</p><ul>"
                             + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>")
    else:
        parts.append('<div class="note">The study has no complete trial yet: run <code>kvtune tune</code> first.</div>')
    for run in (d, r):
        if run is not None and not run.ok:
            parts.append(f'<div class="note">{_e(run.label)} config could not be simulated: {_e(run.error)}</div>')
    if d is None or r is None or not d.ok or not r.ok:
        return "".join(parts)
    header = ["cohort", "metric", "default", "recommended", "change"]
    rows = []
    for name in data.ctx.classes:
        p = f"class.{name}"
        for label, key, lower, fmt in (
            ("p99 TTFT (s)", f"{p}.ttft_s.p99", True, _num),
            ("p99 E2E (s)", f"{p}.e2e_s.p99", True, _num),
            ("p99 TPOT (ms)", f"{p}.tpot_s.p99", True, lambda v: _num(float(v) * 1000 if v is not None else v)),
            ("timed out", f"{p}.count.timed_out", True, _num),
            ("cancelled", f"{p}.count.cancelled", True, _num),
            ("rejected", f"{p}.count.rejected", True, _num),
            ("output tokens/s", f"{p}.output_tokens_per_s", False, _num),
            ("SLO attainment", f"{p}.slo_attainment", False, _pct),
            ("preemptions / request", f"{p}.preemptions_per_request.mean", True, _num),
            ("recompute share", None, True, _pct),
        ):
            if key is None:
                dv, rv = d.class_recompute_share(name), r.class_recompute_share(name)
                rows.append((f"class {_e(name)}", label, fmt(dv), fmt(rv), _change(dv, rv, lower)))
                continue
            dv, rv = d.metrics.get(key), r.metrics.get(key)
            if key.endswith((".cancelled", ".rejected")) and not (dv or rv):
                continue
            rows.append((f"class {_e(name)}", label, fmt(dv), fmt(rv), _change(dv, rv, lower)))
    for label, key, lower, fmt in (
        ("recompute share", "recompute_busy_share", True, _pct),
        ("new-token busy share", "new_token_busy_share", False, _pct),
        ("output tokens/s", "output_tokens_per_s", False, _num),
        ("goodput (req/s in SLO)", "goodput_rps", False, _num),
        ("KV utilization", "kv_utilization", False, _pct),
        ("preemptions", "preemptions_total", True, _num),
        ("timed out", "all.count.timed_out", True, _num),
        ("p99 E2E (s)", "all.e2e_s.p99", True, _num),
    ):
        dv, rv = d.metrics.get(key), r.metrics.get(key)
        rows.append(("all requests", label, fmt(dv), fmt(rv), _change(dv, rv, lower)))
    rows.append(("all requests", "KV cache blocks", f"{d.num_gpu_blocks} x {d.block_size} tok",
                 f"{r.num_gpu_blocks} x {r.block_size} tok", _change(d.kv_tokens, r.kv_tokens, False)))
    rows.append(("all requests", f"$ / million output tokens (at ${d.price_per_hour_usd:g}/h)",
                 _num(d.usd_per_million_output_tokens), _num(r.usd_per_million_output_tokens),
                 _change(d.usd_per_million_output_tokens, r.usd_per_million_output_tokens, True)))
    parts.append(_table(header, rows, left=2))
    changed = _knob_changes(d.knobs, r.knobs)
    if changed:
        parts.append("<h3>Recommended knobs (what differs from the default config)</h3>")
        parts.append(_table(["knob", "default", "recommended"], changed))
    parts.append('<p class="caption">Both configs simulated afresh on the study\'s workload (first replicate seed). '
                 "p99 values include timed-out, cancelled and rejected requests as censored values. "
                 "<code>kvtune export</code> writes the recommended config as a <code>vllm serve --config</code> "
                 "file.</p>")
    return "".join(parts)


def _picked_knobs(data: ReportData) -> dict[str, Any]:
    """The knobs of the recommended trial ({} without a pick)."""
    return dict(data.pick.trial.user_attrs.get("knobs") or {}) if data.pick is not None else {}


def _quality_note(knobs: dict[str, Any]) -> str:
    """What the recommendation's lower precision (FP8 KV cache or weights) is published to do to answer quality,
    with the sources (optimizer/quality.py, as recommended.json's ``quality`` and recommended.yaml's header say
    it); "" at full precision."""
    notes = quality_notes(knobs)
    if not notes:
        return ""
    return ('<div class="note"><b>Lower precision.</b> The recommended config lowers numeric precision ('
            + _e(", ".join(f"{n['knob']}={n['value']}" for n in notes)) + "). kvtune simulates speed and memory, "
            "not answer quality; the published accuracy deltas and their sources:"
            f"<pre>{_e(format_quality_notes(notes))}</pre></div>")


def _knob_changes(default: dict[str, Any], recommended: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for key in list(dict.fromkeys([*recommended, *default])):
        dv, rv = default.get(key, "(engine default)"), recommended.get(key, "(engine default)")
        if dv != rv:
            out.append((_e(key), _e(_short(dv)), f"<b>{_e(_short(rv))}</b>"))
    return out


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _figure_json(chart: Chart) -> tuple[str, str]:
    """The chart's figure as JSON without its layout template, and the template as JSON."""
    fig = json.loads(pio.to_json(chart.figure, validate=False, remove_uids=True))
    template = fig.get("layout", {}).pop("template", {})
    return json.dumps(fig, separators=(",", ":")), json.dumps(template, separators=(",", ":"))


def _script_json(text: str) -> str:
    """JSON safe inside ``<script>``: ``</`` cannot close the element."""
    return text.replace("</", "<\\/")


def _chart_html(chart: Chart, figure_json: str) -> str:
    div = (f'<div id="chart-{chart.id}" class="plotly-graph-div" style="height:{chart.height}px;width:100%"></div>'
           f'<script type="application/json" class="kvtune-figure" data-div="chart-{chart.id}">'
           f"{_script_json(figure_json)}</script>")
    return (f'<section id="{chart.id}"><h2>{_e(chart.title)}</h2><div class="chart">{div}</div>'
            f'<p class="caption">{_e(chart.caption)}</p></section>')


def _pareto_table(data: ReportData, limit: int = 25) -> str:
    df = data.trials
    if not len(df):
        return ""
    front = df[df["pareto"] | df["default"]].copy() if "default" in df else df[df["pareto"]].copy()
    if not len(front):
        return ""
    first = f"objective.{data.objective_names[0]}"
    front = front.sort_values(first, ascending=data.ctx.objectives[0].direction == "minimize").head(limit)
    params = [c for c in df.columns if c.startswith("param.")]
    classes = list(data.ctx.classes)
    header = ["trial"] + [_e(c[len("param."):]) for c in params] + [_e(n) for n in data.objective_names]
    header += [f"{_e(c)} p99 E2E" for c in classes] + ["recompute share", "feasible"]
    rows = []
    for _, row in front.iterrows():
        mark = " (recommended)" if data.pick is not None and int(row["number"]) == data.pick.trial.number else ""
        mark += " (default)" if row.get("default") else ""
        mark += "" if row["pareto"] else " (not Pareto-optimal)"
        cells = [f"{int(row['number'])}{mark}"] + [_e(_short(row.get(c))) for c in params]
        cells += [_num(row.get(f"objective.{n}")) for n in data.objective_names]
        cells += [_num(row.get(f"class.{c}.e2e_s.p99")) for c in classes]
        cells += [_pct(row.get("recompute_busy_share")), "yes" if row["feasible"] else "no"]
        rows.append(cells)
    return ("<h2>Pareto-optimal trials, and the default config</h2>"
            + _table(header, rows, left=1 + len(params)))


def _whatif_table(data: ReportData) -> str:
    if not data.whatifs:
        return ""
    classes = list(data.ctx.classes)
    header = ["scenario", "config", "GPU", "KV blocks", "KV tokens", "output tok/s"]
    header += [f"{_e(c)} p99 E2E (s)" for c in classes] + ["timed out", "recompute share", "$/h", "$/M output tokens"]
    rows = []
    for scenario, run in whatif_rows(data):
        if not run.ok:
            rows.append([_e(scenario), _e(run.label), _e(run.gpu), "-", "-", "-"] + ["-"] * len(classes)
                        + ["-", "-", "-", _e(run.error)])
            continue
        m = run.metrics
        rows.append([_e(scenario), _e(run.label), _e(run.gpu), _num(run.num_gpu_blocks), _num(run.kv_tokens),
                     _num(m.get("output_tokens_per_s"))] + [_num(m.get(f"class.{c}.e2e_s.p99")) for c in classes]
                    + [_num(m.get("all.count.timed_out")), _pct(m.get("recompute_busy_share")),
                       _num(run.price_per_hour_usd), _num(run.usd_per_million_output_tokens)])
    return "<h2>What-if table</h2>" + _table(header, rows, left=3)


def _robustness_table(data: ReportData) -> str:
    """Does the recommendation still meet its SLOs and beat the default when kvtune is off by its validated
    error bands (KV blocks +-5%, step times +-10%)?"""
    robust = data.robustness
    if not robust:
        return ""
    header = ["perturbation", "meets all SLOs", "SLOs missed", "default meets all SLOs", "recommended tput",
              "default tput", "beats default"]
    rows = []
    for r in robust["perturbations"]:
        if "error" in r:
            rows.append([_e(r["perturbation"]), "-", _e(r["error"]), "-", "-", "-", "-"])
            continue
        tput = [k for k in r if k.startswith("recommended_")]
        rec = r[tput[0]] if tput else None
        base = r[tput[0].replace("recommended_", "default_", 1)] if tput else None
        rows.append([_e(r["perturbation"]), "yes" if r["meets_all_slos"] else "<b>no</b>",
                     _e(", ".join(r["missed"]) or "-"), "yes" if r["default_meets_all_slos"] else "no",
                     _num(rec), _num(base), {True: "yes", False: "<b>no</b>", None: "-"}[r["beats_default"]]])
    verdict = (f"Meets its SLOs under every perturbation: {'yes' if robust['meets_slos_under_all'] else 'no'}; "
               f"beats the default under every perturbation: {'yes' if robust['beats_default_under_all'] else 'no'}.")
    if robust.get("gain_within_engine_spread"):
        verdict += (f" Within noise: the predicted throughput gain over the default, {robust['predicted_gain']:+.1%}, "
                    f"is within the engine's run-to-run spread (+/-{robust['engine_spread']:.1%}): a measurement "
                    "should not expect to see it.")
    return (f"<h2>Robustness of the recommendation</h2><p>{_e(verdict)} {_e(robust.get('note', ''))}.</p>"
            + _table(header, rows, left=3))


def _failed_table(data: ReportData) -> str:
    if not len(data.failed):
        return ""
    rows = [(str(int(r["number"])), _e(r["kind"]), _e(r["reason"]), _e(r["params"])) for _, r in data.failed.iterrows()]
    title = "Failed and pruned trials" if (data.failed["kind"] == "pruned").any() else "Failed trials"
    return f"<h2>{title}</h2>" + _table(["trial", "kind", "reason", "params"], rows, left=4)


def render_page(data: ReportData, charts: Sequence[Chart], *, command: str | None = None,
                image_note: str | None = None) -> str:
    """The whole HTML document."""
    spec = data.spec
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " | ".join(f'<a href="#{c.id}">{_e(c.title)}</a>' for c in charts)
    figures = [_figure_json(c) for c in charts]
    template = figures[0][1] if figures else "{}"
    notes = "".join(f'<div class="note">{_e(n)}</div>' for n in [*data.notes, *([image_note] if image_note else [])])
    body = [
        f"<h1>kvtune report: {_e(spec.name)}</h1>",
        f'<div class="question">{_e(spec.description.strip() or "(the study spec has no description)")}</div>',
        notes,
        _facts(data),
        f"<p>{nav}</p>" if nav else "",
        "<h2>Default vs recommended config</h2>",
        _answer(data),
        *[_chart_html(c, fig) for c, (fig, _) in zip(charts, figures)],
        _pareto_table(data),
        _robustness_table(data),
        _whatif_table(data),
        _failed_table(data),
        f'<p class="caption">Generated {now} by kvtune (plotly {plotly.__version__})'
        + (f"; command: <code>{_e(command)}</code>" if command else "") + ".</p>",
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>kvtune report: {_e(spec.name)}</title>"
            f"<style>{_CSS}</style>"
            f"<script>{_ERRORS_JS}</script>"
            f'<script type="application/octet-stream" id="kvtune-plotlyjs">'
            f"{plotlyjs_gzip_base64(partial=uses_partial_bundle(figures))}</script>"
            f'<script type="application/json" id="kvtune-template">{_script_json(template)}</script>'
            f"</head><body><main>{''.join(body)}</main><script>{_RENDER_JS}</script></body></html>\n")


#: plotly.js's "cartesian" partial bundle, gzip-compressed (vendor/README.md), and the trace types it draws.
PARTIAL_BUNDLE = Path(__file__).resolve().parent / "vendor" / "plotly-cartesian-{version}.min.js.gz"
PARTIAL_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                            "image", "pie", "scatter", "scatterternary", "violin"})


def partial_bundle() -> Path | None:
    """The vendored partial bundle of the installed plotly's plotly.js version, if there is one."""
    from plotly.offline import get_plotlyjs_version

    path = Path(str(PARTIAL_BUNDLE).format(version=get_plotlyjs_version()))
    return path if path.exists() else None


def uses_partial_bundle(figures: Sequence[tuple[str, str]]) -> bool:
    """Whether the page can inline the partial bundle: it exists for this plotly.js and draws every trace of
    ``figures`` (``(figure JSON, template JSON)`` pairs)."""
    if partial_bundle() is None:
        return False
    for figure, _ in figures:
        for trace in json.loads(figure).get("data", []):
            if trace.get("type", "scatter") not in PARTIAL_TRACES:
                return False
    return True


@lru_cache(maxsize=2)
def plotlyjs_gzip_base64(partial: bool = False) -> str:
    """plotly.js, gzip-compressed and base64-encoded: the vendored partial bundle (``partial``, see
    :func:`uses_partial_bundle`), else the full one of the installed plotly package."""
    from plotly.offline import get_plotlyjs

    if partial:
        return base64.b64encode(partial_bundle().read_bytes()).decode("ascii")
    return base64.b64encode(gzip.compress(get_plotlyjs().encode("utf-8"), 9, mtime=0)).decode("ascii")


def metrics_document(data: ReportData, images: Sequence[str], image_error: str | None) -> dict[str, Any]:
    """``report.json``: the numbers the page shows, for scripts and READMEs."""

    def run_doc(run: ConfigRun | None) -> dict[str, Any] | None:
        if run is None:
            return None
        if not run.ok:
            return {"label": run.label, "error": run.error, "knobs": run.knobs}
        classes = {}
        for name in data.ctx.classes:
            p = f"class.{name}"
            classes[name] = {k: _json(run.metrics.get(f"{p}.{k}")) for k in (
                "ttft_s.p99", "e2e_s.p99", "tpot_s.p99", "count.total", "count.finished", "count.timed_out",
                "count.cancelled", "count.rejected", "output_tokens_per_s", "slo_attainment",
                "preemptions_per_request.mean", "recomputed_tokens")}
            classes[name]["recompute_busy_share"] = _json(run.class_recompute_share(name))
        return {
            "label": run.label, "gpu": run.gpu, "knobs": run.knobs,
            "num_gpu_blocks": run.num_gpu_blocks, "block_size": run.block_size, "kv_tokens": _json(run.kv_tokens),
            "price_per_hour_usd": run.price_per_hour_usd,
            "usd_per_million_output_tokens": _json(run.usd_per_million_output_tokens),
            **{k: _json(run.metrics.get(k)) for k in ("output_tokens_per_s", "goodput_rps", "recompute_busy_share",
                                                       "new_token_busy_share", "kv_utilization", "preemptions_total",
                                                       "all.e2e_s.p99", "all.count.timed_out", "makespan_s")},
            "classes": classes,
        }

    return {
        "study": data.spec.name,
        "storage": data.storage,
        "trials": data.counts,
        "pick": None if data.pick is None else {"trial": data.pick.trial.number, "rule": data.pick.rule,
                                                "keep_default": data.pick.keep_default,
                                                "feasible": data.pick.feasible,
                                                "shortfalls": [str(s) for s in data.pick.shortfalls],
                                                "quality": quality_notes(_picked_knobs(data))},
        "pareto_trials": data.front_numbers,
        "default": run_doc(data.default),
        "recommended": run_doc(data.recommended),
        "robustness": _json_tree(data.robustness),
        "whatifs": [{"whatif": w.label, "changes": dict(w.changes), "runs": [run_doc(r) for r in runs]}
                    for w, runs in data.whatifs],
        "sweeps": [{"knob": sw.knob, "values": [_json(v) if not isinstance(v, str) else v for v in sw.values],
                    "runs": {base: [run_doc(r) for r in runs] for base, runs in by_base.items()}}
                   for sw, by_base in data.sweeps],
        "trial_table": _trial_rows(data),
        "images": list(images),
        "image_error": image_error,
        "notes": data.notes,
    }


def _json_tree(value: Any) -> Any:
    """``value`` with every float made JSON-safe (NaN/inf -> None)."""
    if isinstance(value, dict):
        return {k: _json_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_tree(v) for v in value]
    return _json(value) if isinstance(value, float) else value


def _trial_rows(data: ReportData) -> list[dict[str, Any]]:
    """Every complete trial: its searched params, objective values and headline metrics per class."""
    out = []
    for _, row in data.trials.iterrows():
        entry: dict[str, Any] = {"number": int(row["number"]), "default": bool(row.get("default", False)),
                                 "feasible": bool(row["feasible"]), "pareto": bool(row["pareto"])}
        entry["params"] = {c[len("param."):]: _plain_value(row[c]) for c in data.trials.columns
                           if c.startswith("param.") and _present(row[c])}
        entry["objectives"] = {n: _json(row.get(f"objective.{n}")) for n in data.objective_names}
        for key in ("output_tokens_per_s", "recompute_busy_share", "new_token_busy_share", "preemptions_total",
                    "all.count.timed_out"):
            entry[key] = _json(row.get(key))
        entry["classes"] = {name: {k: _json(row.get(f"class.{name}.{k}"))
                                   for k in ("ttft_s.p99", "e2e_s.p99", "count.timed_out", "output_tokens_per_s")}
                            for name in data.ctx.classes}
        out.append(entry)
    return out


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _plain_value(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value


def _json(value: Any) -> Any:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return int(value) if value.is_integer() and abs(value) < 2**53 else value

