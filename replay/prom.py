"""vLLM's Prometheus metric names and a parsed ``/metrics`` snapshot.

Names are those of vLLM's V1 engine (vllm/v1/metrics/loggers.py); the V0 spelling of the KV usage gauge
(``vllm:gpu_cache_usage_perc``) is read as a fallback.  Values are summed over label sets (several engines
behind one server add up), except the usage gauge, which is averaged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SWAPPED = "vllm:num_requests_swapped"  # V0 only
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_V0 = "vllm:gpu_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
#: Histogram observed once per engine step (its ``_count`` is the number of iterations).
ITERATION_TOKENS = "vllm:iteration_tokens_total"
#: Histogram of preemptions per finished request (the twin exports it; absent in some vLLM versions).
REQUEST_PREEMPTIONS = "vllm:request_num_preemptions"
REQUEST_SUCCESS = "vllm:request_success_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
#: Gauge with label ``reason``: ``capacity`` (waiting for KV blocks / a batch slot) or ``deferred`` (skipped).
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
#: The twin's engine-clock slack in wall seconds (see replay.twin_engine); absent on vLLM.
TWIN_SLACK = "kvtune:twin_slack_seconds"
#: The twin's speed (simulated seconds per wall second); absent on vLLM.
TWIN_SPEED = "kvtune:twin_speed"

#: Per-request latency histograms (vllm 0.32 v1/metrics/loggers.py): queue, prefill and decode time are stamped by
#: the engine core (scheduled, first-token and last-token step timestamps), TTFT and E2E by the API server.  A
#: replay records their ``_sum`` and ``_count``, whose deltas give exact means over the run.
LATENCY_HISTOGRAMS = {
    "queue_time": "vllm:request_queue_time_seconds",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
    "inference_time": "vllm:request_inference_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}

#: Gauges sampled during a replay for the timeline.
GAUGES = (RUNNING, WAITING, SWAPPED, KV_USAGE)
#: Counters whose before/after difference a replay reports.
COUNTERS = (PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS)

NAN = math.nan


@dataclass
class MetricsSnapshot:
    """One scrape: every sample by name, as ``(labels, value)`` pairs, and when it was taken (trace seconds)."""

    t_s: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str, **labels: str) -> float:
        """Sum over label sets (matching ``labels``); NaN when the metric is absent."""
        rows = self.samples.get(name)
        if rows is None:
            return NAN
        return float(sum(v for lab, v in rows if all(lab.get(k) == want for k, want in labels.items())))

    def mean(self, name: str) -> float:
        rows = self.samples.get(name)
        if not rows:
            return NAN
        return float(sum(v for _, v in rows) / len(rows))

    def kv_usage(self) -> float:
        """KV-cache usage in [0, 1] (V1 name, else the V0 name)."""
        value = self.mean(KV_USAGE)
        return value if value == value else self.mean(KV_USAGE_V0)

    def iterations(self) -> float:
        return self.total(ITERATION_TOKENS + "_count")

    def histogram(self, name: str) -> dict[float, float]:
        """Cumulative bucket counts ``{le: count}`` summed over label sets ({} when absent)."""
        out: dict[float, float] = {}
        for labels, value in self.samples.get(name + "_bucket", []):
            le = float(labels.get("le", "inf"))
            out[le] = out.get(le, 0.0) + value
        return dict(sorted(out.items()))

    def cache_config(self) -> dict[str, str]:
        """Labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks, ...), {} when absent."""
        rows = self.samples.get(CACHE_CONFIG_INFO + "_info") or self.samples.get(CACHE_CONFIG_INFO)
        return dict(rows[0][0]) if rows else {}

    def cache_config_number(self, key: str) -> float:
        """A numeric label of ``cache_config_info`` (``num_gpu_blocks``, ``block_size``, ...); NaN if absent."""
        value = self.cache_config().get(key)
        try:
            return float(value) if value not in (None, "", "None") else NAN
        except ValueError:
            return NAN

    def num_gpu_blocks(self) -> float:
        return self.cache_config_number("num_gpu_blocks")

    def summary(self) -> dict[str, float]:
        """The scalar values a replay records before and after (NaN where absent)."""
        return {
            "num_preemptions_total": self.total(PREEMPTIONS),
            "prompt_tokens_total": self.total(PROMPT_TOKENS),
            "generation_tokens_total": self.total(GENERATION_TOKENS),
            "iterations_total": self.iterations(),
            "num_requests_running": self.total(RUNNING),
            "num_requests_waiting": self.total(WAITING),
            "num_requests_swapped": self.total(SWAPPED),
            "kv_cache_usage_perc": self.kv_usage(),
            "num_gpu_blocks": self.num_gpu_blocks(),
            "block_size": self.cache_config_number("block_size"),
            "prefix_cache_queries_total": self.total(PREFIX_QUERIES),
            "prefix_cache_hits_total": self.total(PREFIX_HITS),
            "num_requests_waiting_capacity": self.total(WAITING_BY_REASON, reason="capacity"),
            "num_requests_waiting_deferred": self.total(WAITING_BY_REASON, reason="deferred"),
            "requests_aborted_total": self.total(REQUEST_SUCCESS, finished_reason="abort"),
            # The twin's own clock lag (absent on vLLM).
            "twin_max_lag_s": self.total("kvtune:twin_max_lag_seconds"),
            **{f"{key}_{part}": self.total(f"{name}_{part}") for key, name in LATENCY_HISTOGRAMS.items()
               for part in ("sum", "count")},
        }


@dataclass(frozen=True)
class FamilySignature:
    """A metric family's shape: its Prometheus type and label names (``le`` aside)."""

    type: str
    labels: frozenset[str]


def metric_families(text: str, prefix: str = "vllm:") -> dict[str, FamilySignature]:
    """Family name -> type and label names, for the families whose names start with ``prefix``; the ``_created``
    gauges prometheus_client adds per counter and histogram are left out (they are the exporter's, not vLLM's)."""
    out: dict[str, FamilySignature] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix) or family.name.endswith("_created"):
            continue
        labels = set()
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                labels |= set(sample.labels)
        out[family.name] = FamilySignature(family.type, frozenset(labels - {"le"}))
    return out


#: Sample names that ``MetricsSnapshot.summary`` reads: what a replay's timeline samples need parsed.
SUMMARY_SAMPLES = frozenset({
    RUNNING, WAITING, SWAPPED, KV_USAGE, KV_USAGE_V0, PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS,
    ITERATION_TOKENS + "_count", REQUEST_SUCCESS, CACHE_CONFIG_INFO, PREFIX_QUERIES, PREFIX_HITS, WAITING_BY_REASON,
    "kvtune:twin_max_lag_seconds",
})


def _only(text: str, names: frozenset[str]) -> str:
    """The sample lines of ``names`` (comments dropped: the parser then keeps every sample name as it is)."""
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for stop in ("{", " "):
            i = line.find(stop)
            if 0 <= i < end:
                end = i
        if line[:end] in names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str, t_s: float = NAN, names: frozenset[str] | None = None) -> MetricsSnapshot:
    """Parse Prometheus text exposition (prometheus_client's parser) into a snapshot; with ``names``, only those
    samples (a real vLLM scrape has ~600 lines; the timeline needs ~20 of them, thousands of times)."""
    snap = MetricsSnapshot(t_s=t_s)
    if names is not None:
        text = _only(text, names)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            snap.samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return snap


__all__ = [
    "CACHE_CONFIG_INFO",
    "COUNTERS",
    "GAUGES",
    "GENERATION_TOKENS",
    "ITERATION_TOKENS",
    "KV_USAGE",
    "KV_USAGE_V0",
    "LATENCY_HISTOGRAMS",
    "FamilySignature",
    "MetricsSnapshot",
    "PREEMPTIONS",
    "PREFIX_HITS",
    "PREFIX_QUERIES",
    "PROMPT_TOKENS",
    "REQUEST_PREEMPTIONS",
    "REQUEST_SUCCESS",
    "SUMMARY_SAMPLES",
    "RUNNING",
    "SWAPPED",
    "TWIN_SLACK",
    "TWIN_SPEED",
    "WAITING",
    "WAITING_BY_REASON",
    "metric_families",
    "parse_metrics",
]
