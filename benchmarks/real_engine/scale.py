"""The at-scale fidelity report (issue 32): measurements with bootstrap 95% intervals, errors, Spearman over configs,
decision agreement over the config pairs the engine itself separates, and the targets.

Pure functions over tables of runs (``run.py --scale`` gathers them from replays and simulations):

- a *run metric* (throughput, preemptions, requests preempted, timeouts) has one value per run; its point value is
  the mean over the runs and its interval a bootstrap of that mean over the runs;
- a *request metric* (TTFT and E2E percentiles, finished requests only) is computed on the requests of all runs
  pooled; its interval is a two-level bootstrap: draw the runs with replacement, then each drawn run's requests
  with replacement, and recompute the pooled percentile.  So a p99 over 3 x 150 requests has an interval from
  those 450 requests and from how much the runs differ (on a shared machine they differ by more than their
  requests' sampling does).

Intervals are percentile bootstraps drawn with numpy (scipy is not a kvtune dependency), seeded, so the report is
deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

#: Request metrics: (column, quantile).
REQUEST_METRICS = {"ttft_p50": ("ttft_s", 0.5), "ttft_p99": ("ttft_s", 0.99), "e2e_p50": ("e2e_s", 0.5),
                   "e2e_p99": ("e2e_s", 0.99)}
#: Run metrics (one value per run).
RUN_METRICS = ("output_tok_s", "preemptions", "requests_preempted", "preempted_twice", "timed_out",
               "prefix_hit_tokens")
COUNT_METRICS = ("preemptions", "requests_preempted", "preempted_twice", "timed_out", "prefix_hit_tokens")
METRICS = ("output_tok_s", *REQUEST_METRICS, "preemptions", "requests_preempted", "preempted_twice", "timed_out",
           "prefix_hit_tokens")
#: Issue 32's targets: the bound on the median |error| over configs x workloads, per metric.
TARGETS = {"output_tok_s": 0.10, "e2e_p50": 0.10, "e2e_p99": 0.10, "ttft_p99": 0.20, "preemptions": 0.10}
#: Decision agreement (share of separable pairs) and the closed loop (|measured/predicted gain - 1|).
AGREEMENT_TARGET, GAIN_TARGET = 0.90, 0.25
#: The metrics the decision agreement is reported by, and which way is better.
DECISION_METRICS = {"output_tok_s": +1, "e2e_p99": -1}
BOOT_RESAMPLES, BOOT_SEED = 2000, 0


def _quantile(values: np.ndarray, q: float) -> float:
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if len(values) else math.nan


def run_interval(values: Sequence[float], resamples: int = BOOT_RESAMPLES, seed: int = BOOT_SEED) -> tuple[float, float, float]:
    """Mean of the runs' values and a percentile-bootstrap 95% interval of it (resampling runs)."""
    x = np.asarray([v for v in values if v == v], dtype=float)
    if not len(x):
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
    return float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def request_interval(per_run: Sequence[np.ndarray], q: float, resamples: int = BOOT_RESAMPLES,
                     seed: int = BOOT_SEED) -> tuple[float, float, float]:
    """The ``q`` quantile of the runs' values pooled, and a percentile-bootstrap 95% interval of it: runs drawn
    with replacement, then each drawn run's values drawn with replacement."""
    runs = [np.asarray(r, dtype=float) for r in per_run]
    runs = [r[np.isfinite(r)] for r in runs]
    runs = [r for r in runs if len(r)]
    if not runs:
        return math.nan, math.nan, math.nan
    point = _quantile(np.concatenate(runs), q)
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for i in range(resamples):
        drawn = [runs[j] for j in rng.integers(0, len(runs), len(runs))]
        stats[i] = np.quantile(np.concatenate([r[rng.integers(0, len(r), len(r))] for r in drawn]), q)
    return point, float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))


def cell(measured_runs: list[dict], predicted_runs: list[dict]) -> dict:
    """One config x workload: per metric the prediction, the measurement, its interval and the error.  Each run is
    ``{"metrics": {run metric: value}, "requests": DataFrame with ttft_s, e2e_s, status}``."""
    out = {"repeats": len(measured_runs)}
    for metric in METRICS:
        if metric in REQUEST_METRICS:
            column, q = REQUEST_METRICS[metric]
            def values(runs):
                return [r["requests"].loc[r["requests"]["status"] == "finished", column].to_numpy(dtype=float)
                        for r in runs]
            meas, lo, hi = request_interval(values(measured_runs), q)
            pred = request_interval(values(predicted_runs), q, resamples=1)[0]
        else:
            meas, lo, hi = run_interval([r["metrics"].get(metric, math.nan) for r in measured_runs])
            pred = run_interval([r["metrics"].get(metric, math.nan) for r in predicted_runs], resamples=1)[0]
        out[metric] = {"pred": pred, "meas": meas, "lo": lo, "hi": hi, "err": error(pred, meas, metric),
                       "per_run": [r["metrics"].get(metric, math.nan) for r in measured_runs]
                       if metric not in REQUEST_METRICS else None}
    return out


def error(pred: float, meas: float, metric: str) -> float:
    """``(pred - meas) / meas``; counts over ``max(meas, 1)``."""
    if not (pred == pred and meas == meas):
        return math.nan
    if metric in COUNT_METRICS:
        return (pred - meas) / max(meas, 1.0)
    return (pred - meas) / meas if meas else math.nan


def separated(a: dict, b: dict) -> bool:
    """Whether two measured 95% intervals do not overlap."""
    vals = (a["lo"], a["hi"], b["lo"], b["hi"])
    if not all(v == v for v in vals):
        return False
    return a["hi"] < b["lo"] or b["hi"] < a["lo"]


def decision_agreement(cells: dict[str, dict], metric: str) -> dict:
    """Over the config pairs whose measured intervals of ``metric`` do not overlap: how many the simulator orders
    the same way (the same winner).  ``cells``: config -> :func:`cell` output."""
    sign = DECISION_METRICS.get(metric, +1)
    names = sorted(cells)
    pairs, agree, disagree = 0, [], []
    for a, b in itertools.combinations(names, 2):
        ma, mb = cells[a][metric], cells[b][metric]
        if not separated(ma, mb):
            continue
        pairs += 1
        meas_winner = a if sign * (ma["meas"] - mb["meas"]) > 0 else b
        dp = sign * (ma["pred"] - mb["pred"])
        pred_winner = a if dp > 0 else b if dp < 0 else None
        (agree if pred_winner == meas_winner else disagree).append([a, b])
    total = len(names) * (len(names) - 1) // 2
    return {"pairs": total, "separable": pairs, "agree": len(agree),
            "share": len(agree) / pairs if pairs else math.nan, "disagreeing": disagree}


def spearman(a, b) -> float:
    a, b = pd.Series(a, dtype=float), pd.Series(b, dtype=float)
    ok = a.notna() & b.notna()
    if ok.sum() < 3:
        return math.nan
    return float(a[ok].rank().corr(b[ok].rank()))


def spread(cells: dict[str, dict], metric: str) -> float:
    """Median over configs of the measured interval's half-width relative to the value: the run-to-run (and
    request-sampling) noise that a difference between configs must exceed."""
    rel = [(c[metric]["hi"] - c[metric]["lo"]) / 2 / abs(c[metric]["meas"]) for c in cells.values()
           if c[metric]["meas"] == c[metric]["meas"] and c[metric]["meas"]]
    return float(np.median(rel)) if rel else math.nan


def gain(new: float, base: float) -> float:
    return (new - base) / base if base == base and new == new and base else math.nan


def closed_loop(cells: dict[str, dict], baseline: str, recommended: str, metrics: Sequence[str],
                export_within_noise: bool | None = None) -> dict:
    """Recommended vs baseline: predicted and measured gain per metric; whether the measured gain is within
    ``GAIN_TARGET`` of the predicted one, or both are within noise (the measured intervals overlap and the
    predicted gain is smaller than the measured spread).  Issue 32's closed loop is ``met`` by the first, or by the
    second where the export said so (``export_within_noise``: its ``robustness.gain_within_engine_spread``, about
    throughput; None where unknown)."""
    out = {}
    for m in metrics:
        b, r = cells[baseline][m], cells[recommended][m]
        pg, mg = gain(r["pred"], b["pred"]), gain(r["meas"], b["meas"])
        noise = max((b["hi"] - b["lo"]) / 2 / abs(b["meas"]) if b["meas"] else math.inf,
                    (r["hi"] - r["lo"]) / 2 / abs(r["meas"]) if r["meas"] else math.inf)
        within_noise = (not separated(b, r)) and abs(pg) <= noise if pg == pg else False
        rel = abs(mg / pg - 1) if pg and pg == pg and mg == mg else math.nan
        said = bool(export_within_noise) and m == "output_tok_s"
        out[m] = {"predicted_gain": pg, "measured_gain": mg, "measured_interval_base": [b["lo"], b["hi"]],
                  "measured_interval_recommended": [r["lo"], r["hi"]], "gain_ratio_error": rel,
                  "met": bool(rel <= GAIN_TARGET or (within_noise and said)) if rel == rel else False,
                  "both_within_noise": bool(within_noise), "export_says_within_noise": said}
    return out


def summarize(rows: list[dict]) -> dict:
    """``rows``: ``{"config", "workload", **cell}``.  Median |error| per metric, Spearman and decision agreement per
    workload and pooled, the spread, and the targets met or missed."""
    med = {}
    for m in METRICS:
        errs = [abs(r[m]["err"]) for r in rows if r[m]["err"] == r[m]["err"]]
        med[m] = float(np.median(errs)) if errs else math.nan
    per_workload = {}
    pooled = {m: {"separable": 0, "agree": 0} for m in DECISION_METRICS}
    for w in sorted({r["workload"] for r in rows}):
        cells = {r["config"]: r for r in rows if r["workload"] == w}
        part = {"configs": len(cells), "spearman": {}, "agreement": {}, "spread": {}}
        for m in DECISION_METRICS:
            part["spearman"][m] = spearman([c[m]["pred"] for c in cells.values()], [c[m]["meas"] for c in cells.values()])
            part["agreement"][m] = decision_agreement(cells, m)
            pooled[m]["separable"] += part["agreement"][m]["separable"]
            pooled[m]["agree"] += part["agreement"][m]["agree"]
        for m in METRICS:
            part["spread"][m] = spread(cells, m)
        per_workload[w] = part
    for m in pooled:
        s = pooled[m]["separable"]
        pooled[m]["share"] = pooled[m]["agree"] / s if s else math.nan
    targets = {}
    for m, bound in TARGETS.items():
        v = med[m]
        targets[f"median_abs_error.{m}"] = {"value": v, "bound": bound, "met": bool(v <= bound) if v == v else False}
    for m in DECISION_METRICS:
        v = pooled[m]["share"]
        targets[f"decision_agreement.{m}"] = {"value": v, "bound": AGREEMENT_TARGET,
                                             "met": bool(v >= AGREEMENT_TARGET) if v == v else False}
    return {"median_abs_error": med, "per_workload": per_workload, "decision_agreement": pooled, "targets": targets}


SHORT = {"output_tok_s": "tok/s", "ttft_p50": "TTFT50", "ttft_p99": "TTFT99", "e2e_p50": "E2E50", "e2e_p99": "E2E99",
         "preemptions": "preempt", "requests_preempted": "req.pre", "preempted_twice": "pre>=2", "timed_out": "t/o",
         "prefix_hit_tokens": "hit tok"}


def _fmt(x: float, metric: str) -> str:
    if x != x:
        return "-"
    if metric in COUNT_METRICS or metric == "output_tok_s":
        return f"{x:.0f}" if abs(x) >= 10 or metric == "prefix_hit_tokens" else f"{x:.1f}"
    return f"{x:.2f}"


def format_rows(rows: list[dict], metrics: Sequence[str] = METRICS) -> list[str]:
    head = "| config | workload | n | " + " | ".join(f"{SHORT[m]} pred / meas [95% CI] (err)" for m in metrics) + " |"
    lines = [head, "|" + "---|" * (3 + len(metrics))]
    for r in rows:
        cells = []
        for m in metrics:
            c = r[m]
            err = f" ({c['err']:+.0%})" if c["err"] == c["err"] else ""
            ci = f" [{_fmt(c['lo'], m)}-{_fmt(c['hi'], m)}]" if c["lo"] != c["hi"] else ""
            cells.append(f"{_fmt(c['pred'], m)} / {_fmt(c['meas'], m)}{ci}{err}")
        lines.append(f"| {r['config']} | {r['workload']} | {r['repeats']} | " + " | ".join(cells) + " |")
    return lines


def format_summary(summary: dict, loop: dict | None) -> list[str]:
    lines = ["median |error| over configs x workloads: " + ", ".join(
        f"{SHORT[m]} {v:.1%}" for m, v in summary["median_abs_error"].items() if v == v)]
    for w, part in summary["per_workload"].items():
        ag = part["agreement"]
        lines.append(f"{w} ({part['configs']} configs): Spearman tok/s {part['spearman']['output_tok_s']:+.2f}, "
                     f"E2E p99 {part['spearman']['e2e_p99']:+.2f}; decision agreement tok/s "
                     f"{ag['output_tok_s']['agree']}/{ag['output_tok_s']['separable']} of {ag['output_tok_s']['pairs']}"
                     f" pairs, E2E p99 {ag['e2e_p99']['agree']}/{ag['e2e_p99']['separable']}; spread (median CI "
                     f"half-width) tok/s {part['spread']['output_tok_s']:.1%}, E2E p99 {part['spread']['e2e_p99']:.1%}")
    if loop:
        for m, g in loop["gains"].items():
            lines.append(f"closed loop {loop['workload']} {loop['recommended']} vs {loop['baseline']}: {SHORT[m]} "
                         f"predicted {g['predicted_gain']:+.1%}, measured {g['measured_gain']:+.1%}"
                         + (" (both within noise" + (", and the export says so)" if g.get("export_says_within_noise")
                                                       else ")") if g["both_within_noise"] else ""))
    lines.append("against the targets:")
    for name, t in summary["targets"].items():
        value = f"{t['value']:.1%}" if t["value"] == t["value"] else "n/a (no pair separable)"
        lines.append(f"  {name}: {value} (target {'<=' if 'error' in name else '>='} {t['bound']:.0%}): "
                     f"{'met' if t['met'] else 'MISSED' if t['value'] == t['value'] else 'not measurable'}")
    if loop:
        g = loop["gains"].get("output_tok_s")
        if g:
            if g["met"]:
                verdict = "met" + (" (both within noise, and the export says so)"
                                   if g["gain_ratio_error"] > GAIN_TARGET else "")
            else:
                verdict = "MISSED" + (" (both within noise, but the export does not say so)"
                                      if g["both_within_noise"] else "")
            lines.append(f"  closed loop tok/s gain: measured/predicted - 1 = {g['gain_ratio_error']:.0%} (target <= "
                         f"{GAIN_TARGET:.0%}, or both within noise and the export says so): {verdict}")
    return lines


# ---- diagnosis: where the E2E p50 error comes from (issue 32) --------------------------------------------------------
#: A cell is engine-bound when its predicted throughput moves in proportion to the step speed (elasticity in this
#: range): then its measured throughput says how fast the engine really stepped.  Below it (an under-loaded cell)
#: throughput is the offered load; above it (client timeouts) it is set by which requests time out.
ENGINE_BOUND_ELASTICITY = (0.8, 1.25)
#: The step-speed factors the diagnosis searches for the one that reproduces a cell's measured throughput.
SPEED_RANGE = (0.1, 10.0)
#: The relative step of the finite-difference elasticities.
ELASTICITY_STEP = 1.1
DIAGNOSED = ("output_tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")


def elasticity(predict, metric: str, step: float = ELASTICITY_STEP) -> float:
    """d log(metric) / d log(step speed) by a central difference: ``predict(speed)`` gives the predicted metrics
    with every step ``speed`` times as fast.  About 1 for an engine-bound throughput, negative for a latency; a
    latency whose magnitude is well above 1 amplifies any error in the speed."""
    up, down = predict(step)[metric], predict(1.0 / step)[metric]
    if not (up > 0 and down > 0):
        return math.nan
    return (math.log(up) - math.log(down)) / (2.0 * math.log(step))


def matched_speed(predict, metric: str, target: float, lo: float = SPEED_RANGE[0], hi: float = SPEED_RANGE[1],
                  iterations: int = 24) -> float:
    """The step-speed factor at which ``predict(speed)[metric]`` (increasing in the speed) equals ``target``, by
    bisection on its logarithm; NaN when ``target`` lies outside what the range gives."""
    f_lo, f_hi = predict(lo)[metric] - target, predict(hi)[metric] - target
    if not (f_lo <= 0 <= f_hi):
        return math.nan
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if predict(mid)[metric] < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def diagnose_cell(row: dict, predict) -> dict:
    """One config x workload of a report's rows: ``predict(speed, client_offset)`` gives its pooled predicted
    metrics (:data:`DIAGNOSED`, plus ``batch``: the time-weighted running batch) with every step ``speed`` times as
    fast as at each run's measured CPU share, and the given client latency (None: the report's).  Returns the
    elasticities, whether the cell is engine-bound, the speed that reproduces its measured throughput (engine-bound
    cells only) and the errors there, and the errors without the client latency."""
    base = predict(1.0, None)
    at = lambda s: predict(s, None)  # noqa: E731
    el = {m: elasticity(at, m) for m in DIAGNOSED}
    bound = bool(ENGINE_BOUND_ELASTICITY[0] <= el["output_tok_s"] <= ENGINE_BOUND_ELASTICITY[1])
    meas = {m: row[m]["meas"] for m in DIAGNOSED}
    out = {"config": row["config"], "workload": row["workload"], "batch": base.get("batch", math.nan),
           "shares": [r["engine_cpu_share"] for r in row.get("runs", [])],
           "pred": {m: base[m] for m in DIAGNOSED}, "err": {m: error(base[m], meas[m], m) for m in DIAGNOSED},
           "elasticity": el, "engine_bound": bound,
           "speed": math.nan, "err_at_speed": {}, "pred_at_speed": {}}
    if bound:
        k = matched_speed(at, "output_tok_s", meas["output_tok_s"])
        out["speed"] = k
        if k == k:
            p = at(k)
            out["pred_at_speed"] = {m: p[m] for m in DIAGNOSED}
            out["err_at_speed"] = {m: error(p[m], meas[m], m) for m in DIAGNOSED}
    no_client = predict(1.0, 0.0)
    out["err_no_client"] = {m: error(no_client[m], meas[m], m) for m in DIAGNOSED}
    # Per run, measured over predicted throughput: how far each run's own CPU share is from the speed it got.
    per_run_meas = row.get("output_tok_s", {}).get("per_run") or []
    per_run_pred = base.get("per_run_tok_s") or []
    same = len(per_run_meas) == len(per_run_pred)
    out["per_run_tok_ratio"] = [m / p if p and m == m and p == p else math.nan
                                for m, p in zip(per_run_meas, per_run_pred)] if same else []
    return out


def _within_sd(groups) -> float:
    """The pooled within-group standard deviation of the logarithms (root mean of each group's variance)."""
    var = [float(np.var(np.log(g), ddof=1)) for g in ([x for x in g if x == x and x > 0] for g in groups) if len(g) > 1]
    return float(math.sqrt(np.mean(var))) if var else math.nan


def _median_abs(values) -> float:
    v = [abs(x) for x in values if x == x]
    return float(np.median(v)) if v else math.nan


def diagnose_summary(cells: list[dict], rows: list[dict]) -> dict:
    """Medians over the diagnosed cells: the report's E2E p50 |error|, and over the engine-bound cells the same at
    their throughput-matched speed; the spread of those speeds and their rank correlation with the batch; the E2E
    p99 decision agreement with those cells' predictions at their matched speed (the others as reported)."""
    bound = [c for c in cells if c["engine_bound"] and c["speed"] == c["speed"]]
    ratios = [x for c in bound for x in c.get("per_run_tok_ratio", []) if x == x]
    ks = [c["speed"] for c in bound]
    out = {"cells": len(cells), "engine_bound": len(bound),
           "median_abs_err": {m: _median_abs(c["err"][m] for c in cells) for m in DIAGNOSED},
           "engine_bound_median_abs_err": {m: _median_abs(c["err"][m] for c in bound) for m in DIAGNOSED},
           "engine_bound_median_abs_err_at_speed": {m: _median_abs(c["err_at_speed"][m] for c in bound)
                                                    for m in DIAGNOSED},
           "median_abs_err_no_client": {m: _median_abs(c["err_no_client"][m] for c in cells) for m in DIAGNOSED},
           "median_e2e_p50_elasticity": float(np.median([c["elasticity"]["e2e_p50"] for c in cells])),
           "speeds": [c["speed"] for c in bound],
           "per_run_tok_ratio_range": [min(ratios), max(ratios)] if ratios else [math.nan, math.nan],
           "per_run_log_sd_within_cells": _within_sd([c["per_run_tok_ratio"] for c in bound]),
           "cell_speed_log_sd": float(np.std(np.log(ks), ddof=1)) if len(ks) > 1 else math.nan,
           "spearman_speed_batch": spearman([c["speed"] for c in bound], [c["batch"] for c in bound]),
           "spearman_speed_share": spearman([c["speed"] for c in bound],
                                            [float(np.mean(c["shares"])) if c["shares"] else math.nan for c in bound])}
    # As re-predicted (the profile given, each run at its CPU share): the report's summary for these metrics.
    by_cell = {(c["config"], c["workload"]): c for c in cells}
    again = []
    for r in rows:
        c = by_cell.get((r["config"], r["workload"]))
        again.append({**r, **{m: dict(r[m], pred=c["pred"][m], err=c["err"][m]) for m in DIAGNOSED}} if c else r)
    s = summarize(again)
    out["repredicted"] = {"median_abs_error": {m: s["median_abs_error"][m] for m in DIAGNOSED},
                          "agreement": {m: {k: s["decision_agreement"][m][k] for k in ("agree", "separable")}
                                        for m in DECISION_METRICS}}
    matched = {(c["config"], c["workload"]): c for c in bound}
    swapped = []
    for r in rows:
        c = matched.get((r["config"], r["workload"]))
        r2 = dict(r)
        if c:
            for m in DIAGNOSED:
                r2[m] = dict(r[m], pred=c["pred_at_speed"][m], err=c["err_at_speed"][m])
        swapped.append(r2)
    s = summarize(swapped)
    out["agreement_at_speed"] = {m: {k: s["decision_agreement"][m][k] for k in ("agree", "separable")}
                                 for m in DECISION_METRICS}
    out["disagreeing_at_speed"] = {w: {m: p["agreement"][m]["disagreeing"] for m in DECISION_METRICS}
                                   for w, p in s["per_workload"].items()}
    return out


def _span(values) -> str:
    v = [x for x in values if x == x]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "none"


def format_diagnosis(cells: list[dict], summary: dict) -> list[str]:
    lines = ["| config | workload | batch | E2E50 elasticity | tok/s err | E2E50 err | engine-bound: speed | "
             "E2E50 err at speed | E2E99 err at speed | E2E50 err, no client latency |", "|" + "---|" * 10]
    pct = lambda x: f"{x:+.0%}" if x == x else "-"  # noqa: E731
    for c in cells:
        sp = f"{c['speed']:.2f}" if c["speed"] == c["speed"] else "no" if not c["engine_bound"] else "-"
        lines.append(f"| {c['config']} | {c['workload']} | {c['batch']:.1f} | {c['elasticity']['e2e_p50']:+.2f} | "
                     f"{pct(c['err']['output_tok_s'])} | {pct(c['err']['e2e_p50'])} | {sp} | "
                     f"{pct(c['err_at_speed'].get('e2e_p50', math.nan))} | "
                     f"{pct(c['err_at_speed'].get('e2e_p99', math.nan))} | {pct(c['err_no_client']['e2e_p50'])} |")
    s = summary
    rp = s["repredicted"]
    errs = ", ".join(f"{SHORT[m]} {v:.1%}" for m, v in rp["median_abs_error"].items())
    agree = ", ".join(f"{SHORT[m]} {a['agree']}/{a['separable']}" for m, a in rp["agreement"].items())
    lines += ["", f"re-predicted, {s['cells']} cells: median |error| {errs}; decision agreement {agree}",
              f"median E2E p50 elasticity to the step speed {s['median_e2e_p50_elasticity']:+.2f}",
              f"engine-bound cells ({s['engine_bound']}): median |error| E2E p50 "
              f"{s['engine_bound_median_abs_err']['e2e_p50']:.1%} as reported, "
              f"{s['engine_bound_median_abs_err_at_speed']['e2e_p50']:.1%} at the speed that matches their measured "
              f"throughput (E2E p99 {s['engine_bound_median_abs_err']['e2e_p99']:.1%} -> "
              f"{s['engine_bound_median_abs_err_at_speed']['e2e_p99']:.1%}, TTFT p50 "
              f"{s['engine_bound_median_abs_err']['ttft_p50']:.1%} -> "
              f"{s['engine_bound_median_abs_err_at_speed']['ttft_p50']:.1%})",
              f"matched speeds {_span(s['speeds'])} (sd of their log "
              f"{s['cell_speed_log_sd']:.3f}); Spearman with the running batch {s['spearman_speed_batch']:+.2f}, with "
              f"the runs' CPU share {s['spearman_speed_share']:+.2f}",
              f"per run, measured / predicted tok/s {_span(s['per_run_tok_ratio_range'])}; sd of its log within a cell "
              f"{s['per_run_log_sd_within_cells']:.3f}",
              f"without the client latency: median |error| E2E p50 {s['median_abs_err_no_client']['e2e_p50']:.1%}, "
              f"TTFT p50 {s['median_abs_err_no_client']['ttft_p50']:.1%} (as reported: "
              f"{s['median_abs_err']['ttft_p50']:.1%})",
              "decision agreement with the engine-bound cells at their matched speed: " + ", ".join(
                  f"{SHORT[m]} {a['agree']}/{a['separable']}" for m, a in s["agreement_at_speed"].items())]
    return lines


def _simulated_predict(row: dict, offset_s: float, dedicated, model, gpu, level: float = 1.0, pace: float = 1.0,
                       requests: int | None = None):
    """``predict(speed, client_offset)`` for :func:`diagnose_cell`: each run of ``row`` simulated as ``run.py
    --scale`` does (same seeds, the dedicated-core coefficients at the run's CPU share), every step ``speed`` times
    as fast (and ``level`` times, for every cell alike), pooled as :func:`cell` pools them; ``batch`` from the
    step table.  ``pace``, ``requests``: the workloads' (the report's, ``run.py --pace --requests``)."""
    from bench_config import BenchConfig, predicted_metrics
    from workloads import SCALE_REQUESTS, build
    from replay.calibrate import ClientLatency, at_cpu_share, with_client_latency
    from sim.runner import simulate

    knobs = dict(row["knobs"], workloads=tuple(row["knobs"]["workloads"]))
    cfg, workload = BenchConfig(**knobs), build(row["workload"], pace, requests or SCALE_REQUESTS)
    memo: dict = {}

    def predict(speed: float, client: float | None) -> dict:
        key = (speed, client)
        if key not in memo:
            runs, batch = [], []
            for run in row["runs"]:
                res = simulate(workload, cfg.engine_config(), model, gpu, seed=run["rep"], record_steps=True,
                               coefficients=at_cpu_share(dedicated, run["engine_cpu_share"] * speed * level),
                               hash_block_tokens=workload.hash_block_tokens)
                req = with_client_latency(res.requests, ClientLatency(offset_s=offset_s if client is None else client))
                runs.append({"metrics": predicted_metrics(req), "requests": req})
                d = res.steps["duration_s"]
                batch.append(float((res.steps["num_running"] * d).sum() / d.sum()) if d.sum() > 0 else math.nan)
            out = {}
            for m in DIAGNOSED:
                if m in REQUEST_METRICS:
                    column, q = REQUEST_METRICS[m]
                    out[m] = request_interval([r["requests"].loc[r["requests"]["status"] == "finished", column]
                                               .to_numpy(dtype=float) for r in runs], q, resamples=1)[0]
                else:
                    out[m] = run_interval([r["metrics"].get(m, math.nan) for r in runs], resamples=1)[0]
            out["batch"] = float(np.mean(batch))
            out["per_run_tok_s"] = [r["metrics"].get("output_tok_s", math.nan) for r in runs]
            memo[key] = out
        return memo[key]

    return predict


def diagnose_main(argv=None) -> int:
    """``python benchmarks/real_engine/scale.py --model MODEL_DIR``: the diagnosis of a saved at-scale report (its
    ``normalized`` rows), re-predicted with the simulator; no engine."""
    import argparse
    import json
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parents[1])]
    from optimizer import add_latency_arguments, add_model_argument
    from sim.errors import ConfigError

    ap = argparse.ArgumentParser(description="Where the at-scale report's E2E p50 error comes from (issue 32): "
                                             "re-predicts the saved report's cells with the simulator, no engine.")
    ap.add_argument("--report", type=Path, default=here / "measurements" / "scale-report.json",
                    help="the at-scale report (default measurements/scale-report.json)")
    add_latency_arguments(ap, profile_help="the profile the report used (default measurements/scale-profile.yaml)",
                          coef=False)
    add_model_argument(ap, help="the HF model folder the report simulated (its config.json)", required=True)
    ap.set_defaults(profile=str(here / "measurements" / "scale-profile.yaml"))
    ap.add_argument("--speed", type=float, default=1.0,
                    help="one step-speed factor for every run (default 1: each run at its CPU share); for a profile "
                         "whose CPU share was not measured, to compare its shape across cells at a common level")
    ap.add_argument("--out", type=Path, default=None, help="write the diagnosis as JSON here")
    args = ap.parse_args(argv)
    args.profile = Path(args.profile)
    if not (args.speed > 0 and math.isfinite(args.speed)):
        print(f"scale.py: --speed: a positive number, got {args.speed}", file=sys.stderr)
        return 2
    try:
        try:
            doc = json.loads(args.report.read_text())
            rows = doc["modes"]["normalized"]["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(str(args.report), f"not an at-scale report with normalized rows ({exc})") from None
        from sim.latency import coefficients_from_mapping, read_profile
        from sim.profiles import load_gpu, load_model
        from sim.safe_yaml import read_yaml

        prof = read_profile(args.profile)
        fit = (read_yaml(args.profile) or {}).get("fit") or {}
        if not fit.get("dedicated_core_coefficients"):
            raise ConfigError(f"{args.profile}: fit.dedicated_core_coefficients",
                              "missing (a kvtune calibrate profile)")
        dedicated = coefficients_from_mapping(fit["dedicated_core_coefficients"])
        model, gpu = load_model(args.model, field="--model"), load_gpu(prof.gpu or "vllm-cpu-1core")
    except ConfigError as exc:
        print(f"scale.py: {exc}", file=sys.stderr)
        return 2
    offset = float(prof.client_offset_s)  # the profile's, as run.py --scale adds it
    pace, requests = float(doc.get("pace", 1.0)), doc.get("requests")  # reports before --pace: 1, 150
    cells = [diagnose_cell(r, _simulated_predict(r, offset, dedicated, model, gpu, args.speed, pace, requests))
             for r in rows]
    summary = diagnose_summary(cells, rows)
    print("\n".join(format_diagnosis(cells, summary)))
    if args.out:
        args.out.write_text(json.dumps({"report": str(args.report), "profile": str(args.profile),
                                        "client_offset_s": offset, "speed": args.speed, "cells": cells,
                                        "summary": summary},
                                       indent=1, default=float) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(diagnose_main())
