"""``format_summary``: the compact text table ``kvtune simulate`` prints."""

from __future__ import annotations

import math

from objectives._cohorts import CohortStats, Quantiles
from objectives._summary import Summary

_HEADER = (
    f"{'cohort':<18}{'total':>7}{'fin':>7}{'t/o':>6}{'canc':>6}{'rej':>6}{'unf':>6}"
    f"{'TTFT p50/p99 s':>17}{'TPOT p50/p99 ms':>18}{'E2E p50/p99 s':>17}{'cens':>7}{'SLO met':>9}"
    f"{'out tok/s':>11}{'preempt/req':>13}{'max gap p99 s':>15}"
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
    gap = c.stalls.get("max_itl_s")
    return (
        f"{label[:18]:<18}{n.total:>7}{n.finished:>7}{n.timed_out:>6}{n.cancelled:>6}{n.rejected:>6}{n.unfinished:>6}"
        f"{_pair(c.ttft_s):>17}{_pair(c.tpot_s, 1000.0, 1):>18}{_pair(c.e2e_s):>17}{_pct(c.e2e_s.censored_share):>7}"
        f"{_pct(c.slo_attainment):>9}{_num(c.output_tokens_per_s, digits=1):>11}{_num(c.preemptions_mean):>13}"
        f"{_num(gap.p99 if gap else math.nan):>15}"
    )


def format_summary(summary: Summary) -> str:
    """Per-class rows, an ``all`` row, non-empty prompt-length, output-length and preemption-count buckets, then
    run-wide figures.  Latencies include censored requests (timed out, cancelled, rejected, unfinished);
    ``cens`` is the share of the cohort's E2E values that are censored; ``inf`` is a request that never got an
    answer; ``-`` is unknown or empty."""
    lines = [_HEADER]
    lines += [_row(name, c) for name, c in summary.classes.items()]
    lines.append(_row("all", summary.overall))
    if summary.overall.counts.capped:
        lines.append(f"  of the finished, {summary.overall.counts.capped} capped: stopped at max_model_len before "
                     f"their output target (finish reason length)")
    for title, cohorts in (("prompt", summary.prompt_buckets), ("output", summary.output_buckets),
                           ("preempted", summary.preemption_buckets)):
        rows = [(f"{title} {label}", c) for label, c in cohorts.items() if c.counts.total]
        if rows:
            lines.append("")
            lines += [_row(label, c) for label, c in rows]
    s, p, t = summary.steps, summary.preemptions, summary.steps.time
    stalls = summary.overall.stalls
    lines += [
        "",
        f"makespan {_num(summary.makespan_s, digits=1)} s | output {_num(summary.output_tokens_per_s, digits=1)} tok/s"
        f" | goodput {_num(summary.goodput_rps, digits=3)} req/s | GPU busy {_pct(s.busy_fraction)} of the time",
        f"busy time: new prefill {_pct(t.share('prefill_new'))}, recompute {_pct(t.share('recompute'))},"
        f" decode {_pct(t.share('decode'))}, transfer {_pct(t.share('transfer'))}, overhead {_pct(t.share('overhead'))}"
        f" | new-token busy share {_pct(s.new_token_busy_share)}",
        f"token shares: new {_pct(s.new_token_token_share)}, recompute {_pct(s.recompute_token_share)}"
        f" | KV utilization {_pct(s.kv_utilization)} (peak {_pct(s.kv_utilization_peak)})",
        f"preemptions/request mean {_num(p.mean)} p99 {_num(p.p99, digits=0)} max {_num(p.max, digits=0)}"
        f" | preempted >=1 {_pct(p.share_ge1)} >=2 {_pct(p.share_ge2)}"
        f" | swap/offload blocks out {_num(s.swap_out_blocks, digits=0)} in {_num(s.swap_in_blocks, digits=0)}",
        f"ITL p50/p99 {_num(s.itl_s_p50, 1000.0, 1)}/{_num(s.itl_s_p99, 1000.0, 1)} ms"
        f" | longest gap/request p99 {_stall(stalls, 'max_itl_s')} | preempted time/request p99"
        f" {_stall(stalls, 'preempted_s')} | queue wait p99 {_stall(stalls, 'queue_wait_s')}"
        f" | resume wait p99 {_stall(stalls, 'resume_wait_s')}",
    ]
    return "\n".join(lines)


def _stall(stalls: dict, metric: str) -> str:
    tail = stalls.get(metric)
    return "-" if tail is None else f"{_num(tail.p99)} s (max {_num(tail.max)})"


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"
