"""``format_summary``: the compact text table ``kvtune simulate`` prints."""

from __future__ import annotations

import math

from objectives._cohorts import CohortStats, Quantiles
from objectives._summary import Summary

_HEADER = (
    f"{'cohort':<16}{'total':>7}{'fin':>7}{'t/o':>6}{'canc':>6}{'rej':>6}{'unf':>6}"
    f"{'TTFT p50/p99 s':>17}{'TPOT p50/p99 ms':>18}{'E2E p50/p99 s':>17}{'out tok/s':>11}{'preempt/req':>13}"
)


def _num(value: float, scale: float = 1.0, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value * scale:.{digits}f}"


def _pair(q: Quantiles, scale: float = 1.0, digits: int = 2) -> str:
    return f"{_num(q.p50, scale, digits)}/{_num(q.p99, scale, digits)}"


def _row(label: str, c: CohortStats) -> str:
    n = c.counts
    return (
        f"{label[:16]:<16}{n.total:>7}{n.finished:>7}{n.timed_out:>6}{n.cancelled:>6}{n.rejected:>6}{n.unfinished:>6}"
        f"{_pair(c.ttft_s):>17}{_pair(c.tpot_s, 1000.0, 1):>18}{_pair(c.e2e_s):>17}"
        f"{_num(c.output_tokens_per_s, digits=1):>11}{_num(c.preemptions_mean):>13}"
    )


def format_summary(summary: Summary) -> str:
    """Per-class rows, an ``all`` row, non-empty prompt-length buckets, then run-wide figures.  Latencies
    include censored requests (timed out, cancelled, rejected, unfinished); ``inf`` is a request that never
    got an answer; ``-`` is unknown or empty."""
    lines = [_HEADER]
    lines += [_row(name, c) for name, c in summary.classes.items()]
    lines.append(_row("all", summary.overall))
    if summary.overall.counts.capped:
        lines.append(f"  of the finished, {summary.overall.counts.capped} capped: stopped at max_model_len before "
                     f"their output target (finish reason length)")
    buckets = [(f"prompt {label}", c) for label, c in summary.prompt_buckets.items() if c.counts.total]
    if buckets:
        lines.append("")
        lines += [_row(label, c) for label, c in buckets]
    s, p = summary.steps, summary.preemptions
    lines += [
        "",
        f"makespan {_num(summary.makespan_s, digits=1)} s | output {_num(summary.output_tokens_per_s, digits=1)} tok/s"
        f" | goodput {_num(summary.goodput_rps, digits=3)} req/s",
        f"busy GPU time on new tokens {_pct(s.new_token_busy_share)} | recompute share {_pct(s.recompute_share)}"
        f" | KV utilization {_pct(s.kv_utilization)} (peak {_pct(s.kv_utilization_peak)})",
        f"preemptions/request mean {_num(p.mean)} p99 {_num(p.p99, digits=0)} max {_num(p.max, digits=0)}"
        f" | preempted >=1 {_pct(p.share_ge1)} >=2 {_pct(p.share_ge2)}"
        f" | swap/offload blocks out {_num(s.swap_out_blocks, digits=0)} in {_num(s.swap_in_blocks, digits=0)}",
    ]
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"
