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


def closed_loop(cells: dict[str, dict], baseline: str, recommended: str, metrics: Sequence[str]) -> dict:
    """Recommended vs baseline: predicted and measured gain per metric; whether the measured gain is within
    ``GAIN_TARGET`` of the predicted one, or both are within noise (the measured intervals overlap and the
    predicted gain is smaller than the measured spread)."""
    out = {}
    for m in metrics:
        b, r = cells[baseline][m], cells[recommended][m]
        pg, mg = gain(r["pred"], b["pred"]), gain(r["meas"], b["meas"])
        noise = max((b["hi"] - b["lo"]) / 2 / abs(b["meas"]) if b["meas"] else math.inf,
                    (r["hi"] - r["lo"]) / 2 / abs(r["meas"]) if r["meas"] else math.inf)
        within_noise = (not separated(b, r)) and abs(pg) <= noise if pg == pg else False
        rel = abs(mg / pg - 1) if pg and pg == pg and mg == mg else math.nan
        out[m] = {"predicted_gain": pg, "measured_gain": mg, "measured_interval_base": [b["lo"], b["hi"]],
                  "measured_interval_recommended": [r["lo"], r["hi"]], "gain_ratio_error": rel,
                  "met": bool(rel <= GAIN_TARGET) if rel == rel else False, "both_within_noise": bool(within_noise)}
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
                         + (" (both within noise)" if g["both_within_noise"] else ""))
    lines.append("against the targets:")
    for name, t in summary["targets"].items():
        value = f"{t['value']:.1%}" if t["value"] == t["value"] else "n/a (no pair separable)"
        lines.append(f"  {name}: {value} (target {'<=' if 'error' in name else '>='} {t['bound']:.0%}): "
                     f"{'met' if t['met'] else 'MISSED' if t['value'] == t['value'] else 'not measurable'}")
    if loop:
        g = loop["gains"].get("output_tok_s")
        if g:
            lines.append(f"  closed loop tok/s gain: measured/predicted - 1 = {g['gain_ratio_error']:.0%} (target <= "
                         f"{GAIN_TARGET:.0%}): {'met' if g['met'] else 'both within noise' if g['both_within_noise'] else 'MISSED'}")
    return lines
