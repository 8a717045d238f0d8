"""The twin's ``/metrics`` collector: :class:`~replay.twin_metrics.TwinStats` and the engine's own state under
vLLM 0.32's metric names (see :mod:`replay.twin_metrics` for what is counted when)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from replay.twin_engine import TwinEngine
from replay.twin_metrics import ADMISSION_REASONS, CACHED_SOURCES, FINISHED_REASONS, HISTOGRAMS, Histogram


class TwinCollector:
    """Exposes the engine's state under vLLM's metric names (labels ``model_name`` and ``engine``)."""

    def __init__(self, engine: "TwinEngine", model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        eng = self.engine
        st = eng.stats
        names = ["engine", "model_name"]
        values = ["0", self.model_name]

        def gauge(name: str, doc: str, value: float):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float):
            m = CounterMetricFamily(name, doc, labels=names)
            m.add_metric(values, value)
            return m

        def labelled(kind, name: str, doc: str, label: str, items):
            m = kind(name, doc, labels=names + [label])
            for key, value in items:
                m.add_metric(values + [key], value)
            return m

        def histogram(name: str, doc: str, h: Histogram):
            m = HistogramMetricFamily(name, doc, labels=names)
            m.add_metric(values, h.buckets(), h.sum)
            return m

        # vLLM's counters of work it estimates (MFU metrics), off by default: 0.
        yield counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU "
                      "(for Model Flops Utilization calculations).", 0.0)
        yield counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU "
                      "(for Model Flops Utilization calculations).", 0.0)
        yield counter("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU "
                      "(for Model Flops Utilization calculations).", 0.0)
        waiting = eng.num_waiting()
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", eng.num_running())
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        yield labelled(GaugeMetricFamily, "vllm:num_requests_waiting_by_reason",
                       "Number of requests waiting, broken down by reason.", "reason",
                       [("capacity", waiting), ("deferred", 0)])
        yield labelled(GaugeMetricFamily, "vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is "
                       "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                       "discard_all = 1 means sleep level 2.", "sleep_state",
                       [("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)])
        if not eng.config.is_v1:
            yield gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", eng.num_swapped())
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", eng.kv_usage())
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      st.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      st.prefix_hits)
        yield counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
                      "cross-instance cache sharing, in terms of number of queried tokens.", 0)
        yield counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                      "cross-instance cache sharing, in terms of number of cached tokens.", 0)
        yield counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", 0)
        yield counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        yield labelled(CounterMetricFamily, "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                       "source", [("local_compute", st.prompt_computed), ("local_cache_hit", st.prompt_cached),
                                  ("external_kv_transfer", 0)])
        yield counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
                      st.prompt_cached)
        yield labelled(CounterMetricFamily, "vllm:prompt_tokens_cached_by_source",
                       "Number of cached prompt tokens by tier.", "source",
                       [(s, st.prefix_hits if s == "device" else 0) for s in CACHED_SOURCES])
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens)
        yield labelled(CounterMetricFamily, "vllm:request_success", "Count of successfully processed requests.",
                       "finished_reason", [(r, st.success.get(r, 0)) for r in FINISHED_REASONS])
        rejections = CounterMetricFamily("vllm:admission_rejections", "Number of requests rejected by frontend "
                                         "admission control.", labels=["model_name", "reason"])
        for reason in ADMISSION_REASONS:
            rejections.add_metric([self.model_name, reason], 0)
        yield rejections
        for name, doc, attr in HISTOGRAMS:
            yield histogram(name, doc, getattr(st, attr))
        yield self._cache_config_info()
        yield from self._own(eng)

    def _cache_config_info(self) -> GaugeMetricFamily:
        """vLLM's ``cache_config_info``: one sample whose labels are the CacheConfig fields (vllm 0.32 labels,
        with the twin's values where it has the setting and vLLM's defaults where it has none)."""
        eng = self.engine
        cfg = eng.config
        blocks = eng.sizing.num_gpu_blocks
        block = cfg.block_size
        max_len = eng.max_model_len
        kv_bytes = eng.model.kv_bytes_per_token(1 if cfg.kv_cache_dtype == "fp8" else 2) * block * blocks
        offload = getattr(cfg, "kv_offloading_size_gb", None)
        labels = {
            "_block_size_resolved": "True", "block_size": str(block), "cache_dtype": str(cfg.kv_cache_dtype),
            "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(block),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(bool(cfg.enable_prefix_caching)),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization), "hash_block_size": "None",
            "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
            "kv_cache_max_concurrency": repr(blocks * block / max_len) if max_len else "None",
            "kv_cache_memory_bytes": str(int(kv_bytes)), "kv_cache_size_tokens": str(blocks * block),
            "kv_offloading_backend": "native", "kv_offloading_size": str(offload) if offload else "None",
            "kv_sharing_fast_prefill": "False", "mamba_block_size": "None", "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none", "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto",
            "num_cpu_blocks": str(eng.sizing.num_cpu_blocks or "None"), "num_gpu_blocks": str(blocks),
            "num_gpu_blocks_override": str(cfg.num_gpu_blocks_override),
            "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None",
            "replayssm_buffer_len": "16", "skip_page_size_padded": "None", "sliding_window": "None",
            "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
            "user_specified_block_size": "True", "engine": "0",
        }
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=sorted(labels))
        info.add_metric([labels[k] for k in sorted(labels)], 1.0)
        return info

    def _own(self, eng: "TwinEngine"):
        """The twin's own health: how far its clock runs behind the wall clock (simulated seconds)."""
        c = eng.counters
        for name, doc, value in (
            ("kvtune:twin_lag_seconds", "Simulated seconds the twin's engine clock lagged at its last step.", c.lag_s),
            ("kvtune:twin_max_lag_seconds", "Largest lag of the twin's engine clock so far.", c.max_lag_s),
            ("kvtune:twin_sim_time_seconds", "The twin's engine clock (simulated seconds since start).", eng.now_s),
            ("kvtune:twin_speed", "Simulated seconds per wall second.", eng.speed),
            ("kvtune:twin_slack_seconds", "Wall seconds the engine clock runs behind arrivals (--slack-ms).",
             eng.slack_s),
            ("kvtune:kv_blocks_total", "Usable GPU KV blocks of the simulated engine.", eng.scheduler.pool.num_blocks),
            ("kvtune:kv_blocks_used", "GPU KV blocks held by requests.", eng.scheduler.pool.num_used),
        ):
            yield GaugeMetricFamily(name, doc, value=value)


__all__ = ["TwinCollector"]
