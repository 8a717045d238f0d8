"""A request's live state inside the engine, with the per-request accounting the request table reports."""

from __future__ import annotations

import math
from enum import Enum
from typing import Final

from mypy_extensions import i64


class Status(str, Enum):
    """Final statuses of the request table (docs/design.md, 'Data contracts'), plus the live ones."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    #: vLLM's WAITING_FOR_REMOTE_KVS: its offloaded blocks are being loaded back from the CPU tier.
    LOADING = "waiting_for_remote_kvs"
    FINISHED = "finished"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    UNFINISHED = "unfinished"


FINAL_STATUSES = (Status.FINISHED, Status.TIMED_OUT, Status.CANCELLED, Status.REJECTED, Status.UNFINISHED)


class Request:
    """Token and block state of one request (vllm/v1/request.py ``Request``, reduced to what scheduling needs).

    ``num_tokens`` = prompt + generated; ``num_computed_tokens`` = tokens whose KV is in the cache;
    ``high_water`` = most tokens ever computed, so that re-prefilling below it counts as recompute.
    """

    __slots__ = (
        "index", "request_id", "class_name", "arrival_s", "prompt_tokens", "output_tokens_target",
        "max_output", "priority", "predicted_output", "timeout_at", "cancel_at",
        "num_output_tokens", "num_computed_tokens", "high_water", "blocks", "status",
        "first_scheduled_s", "first_token_s", "end_s", "num_preemptions", "recomputed_tokens",
        "preempted_at", "resume_wait_s", "swapped_out_blocks", "swapped_in_blocks", "kv_blocks_peak",
        "prefix_hit_tokens", "preempted_hit_tokens", "processed_tokens", "prefix_keys", "block_ids",
        "blocks_freed", "appended_tokens",
        "last_token_s", "max_itl_s", "stalled_since", "preempted_s",
        "time_prefill_new_s", "time_recompute_s", "time_decode_s", "time_overhead_s", "decode_entry",
    )
    # Token and block counts as ``i64``: machine integers in the compiled engine's object layout, read and written
    # without the tag checks and reference counts of Python ints (the decode fast path and ``update_from_output``
    # touch several of them per running request per step).  Interpreted, ``i64`` is ``int``; the values are token
    # and block counts (or decode_columns.STALE_INT, -2**40), far below 2**63.  ``index`` stays ``int``: it is a key of
    # dicts (the KV tiers), where an ``i64`` would be boxed anew at each read.
    index: Final[int]
    request_id: Final[int]
    prompt_tokens: Final[i64]
    output_tokens_target: Final[i64]
    max_output: Final[i64]
    num_output_tokens: i64
    num_computed_tokens: i64
    high_water: i64
    blocks: i64
    num_preemptions: i64
    recomputed_tokens: i64
    swapped_out_blocks: i64
    swapped_in_blocks: i64
    kv_blocks_peak: i64
    prefix_hit_tokens: i64
    preempted_hit_tokens: i64
    processed_tokens: i64
    appended_tokens: i64

    def __init__(
        self,
        index: int,
        request_id: int,
        class_name: str,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens_target: int,
        max_model_len: int,
        priority: int = 0,
        predicted_output: int = 0,
        timeout_at: float = math.inf,
        cancel_at: float = math.inf,
        prefix_keys: tuple[int, ...] = (),
    ):
        self.index = index
        self.request_id = request_id
        self.class_name = class_name
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens_target = output_tokens_target
        # vLLM stops a sequence at max_model_len (finish reason "length").
        self.max_output = max(0, min(output_tokens_target, max_model_len - prompt_tokens))
        self.priority = priority
        self.predicted_output = predicted_output
        self.timeout_at = timeout_at
        self.cancel_at = cancel_at
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.high_water = 0
        self.blocks = 0
        self.status = Status.WAITING
        self.first_scheduled_s = math.nan
        self.first_token_s = math.nan
        self.end_s = math.nan
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.preempted_at = math.nan
        self.resume_wait_s = 0.0
        #: Blocks copied out to CPU memory (V0 swap, V1 offload).  The V1 CPU tier's copies are counted in the tier
        #: and added here when the request ends (``BaseScheduler.settle``), so while it is live this lacks them.
        self.swapped_out_blocks = 0
        self.swapped_in_blocks = 0
        self.kv_blocks_peak = 0
        #: Prefix-cache hit tokens as vLLM counts them (``vllm:prefix_cache_hits``, the request's ``num_cached_tokens``):
        #: its lookup before any preemption.  A previously preempted request's lookups (which mostly re-hit its own
        #: surviving blocks) go to ``preempted_hit_tokens``, vLLM's ``PrefixCacheStats.preempted_hits``, which
        #: /metrics does not export (v1/core/kv_cache_manager.py, v1/metrics/stats.py ``PrefixCacheStats.record``).
        self.prefix_hit_tokens = 0
        self.preempted_hit_tokens = 0
        self.processed_tokens = 0
        #: Hashes of the leading prompt blocks other requests may share (from the trace's ``hash_ids``; even, see
        #: :func:`~sim.engine.prefix_pool.block_hash`).
        self.prefix_keys = prefix_keys
        #: Ids of the leading blocks that carry a hash, when the pool tracks blocks one by one
        #: (:class:`~sim.engine.prefix_pool.PrefixBlockPool`: its slots, negative for own blocks not in its map yet);
        #: the other ``blocks - len(block_ids)`` have none.
        self.block_ids: list[int] = []
        #: That pool has freed its blocks before (a preemption): copies of its own blocks may still be cached.
        self.blocks_freed = False
        #: When its last output token came out, and the longest gap between two of its output tokens.
        self.last_token_s = math.nan
        self.max_itl_s = math.nan
        #: Preempted since (NaN: producing); ``preempted_s`` sums preemption-to-next-token stalls.
        self.stalled_since = math.nan
        self.preempted_s = 0.0
        #: Its share of the steps' time parts (``sim.latency.StepParts``), accumulated by the engine core.
        self.time_prefill_new_s = 0.0
        self.time_recompute_s = 0.0
        self.time_decode_s = 0.0
        self.time_overhead_s = 0.0
        #: V0: tokens appended to the request's block table (vllm/core/block/block_table.py ``_num_full_slots``).
        self.appended_tokens = 0
        #: Its ``(self, 1)`` entry of ``SchedulerOutput.scheduled`` as a decode of the fast path, made once and
        #: reused every step (``BaseScheduler._schedule_decode_prefix``); dropped when it ends (the tuple refers to
        #: the request).  Typed ``object``: mypyc keeps it boxed, the same tuple, instead of an unboxed pair.
        self.decode_entry: object = None

    @property
    def num_tokens(self) -> i64:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def deadline(self) -> float:
        return self.timeout_at if self.timeout_at <= self.cancel_at else self.cancel_at

    def stall(self, now: float) -> None:
        """Preempted at ``now``: a stall starts unless one is already running (no token since the last)."""
        if self.stalled_since != self.stalled_since:
            self.stalled_since = now

    def end_stall(self, now: float) -> None:
        """A token came out, or the request ended, at ``now``: a running stall ends and is added up."""
        if self.stalled_since == self.stalled_since:
            self.preempted_s += now - self.stalled_since
            self.stalled_since = math.nan

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.blocks})"
        )


#: What the request table records of a request when it ends (``sim.tables.RequestLog.record_all``), in the order
#: :func:`outcomes` returns them.
OUTCOME_ATTRIBUTES = (
    "status", "first_scheduled_s", "first_token_s", "end_s", "num_output_tokens", "resume_wait_s", "num_preemptions",
    "recomputed_tokens", "swapped_out_blocks", "swapped_in_blocks", "kv_blocks_peak", "prefix_hit_tokens",
    "preempted_hit_tokens", "max_itl_s", "preempted_s", "time_prefill_new_s", "time_recompute_s", "time_decode_s",
    "time_overhead_s",
)


def outcomes(reqs: list[Request]) -> list[list]:
    """``reqs``' values of each of :data:`OUTCOME_ATTRIBUTES`, one list per attribute.  Compiled (sim/_compiled.py),
    each list is a loop of direct field reads; the request table's ``getattr`` by name, interpreted, was about half
    of recording the ended requests (2-5% of a cold incident run, perf)."""
    return [
        [r.status for r in reqs],
        [r.first_scheduled_s for r in reqs],
        [r.first_token_s for r in reqs],
        [r.end_s for r in reqs],
        [r.num_output_tokens for r in reqs],
        [r.resume_wait_s for r in reqs],
        [r.num_preemptions for r in reqs],
        [r.recomputed_tokens for r in reqs],
        [r.swapped_out_blocks for r in reqs],
        [r.swapped_in_blocks for r in reqs],
        [r.kv_blocks_peak for r in reqs],
        [r.prefix_hit_tokens for r in reqs],
        [r.preempted_hit_tokens for r in reqs],
        [r.max_itl_s for r in reqs],
        [r.preempted_s for r in reqs],
        [r.time_prefill_new_s for r in reqs],
        [r.time_recompute_s for r in reqs],
        [r.time_decode_s for r in reqs],
        [r.time_overhead_s for r in reqs],
    ]
