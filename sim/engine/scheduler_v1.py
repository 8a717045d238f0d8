"""vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py and v1/core/kv_cache_manager.py, vLLM 0.33.0).

One token budget per step, chunked prefill always on.  Running requests first, in order; a request that
cannot get its blocks preempts the last running request (or the lowest-priority one) until it fits or has
preempted itself.  Waiting requests are admitted only in steps that preempted nothing, stopping at
``max_num_seqs`` or at the first request whose blocks do not fit (head-of-line, FCFS).
"""

from __future__ import annotations

from typing import Final

from sim.engine.config import EngineConfig
from sim.engine.request import Request, Status
from sim.engine.scheduler_base import BaseScheduler, SchedulerOutput


#: No prefix-cache hits (a unique prompt's admission; PrefixBlockPool.lookup returns hits as a list of block ids).
_NO_HITS: Final[list[int]] = []  # (Final: a C static, see prefix_pool._NO_IDS)


class V1Scheduler(BaseScheduler):
    """The ``vllm-v1`` flavor."""

    @property
    def supports_decode_columns(self) -> bool:
        """Its running loop reads only the requests after the decode prefix and preempts from the back (FCFS;
        the priority policy keeps no columns, see use_decode_columns)."""
        return True

    def __init__(self, config: EngineConfig, num_gpu_blocks: int, num_cpu_blocks: int,
                 predicted_output: dict[str, int] | None = None):
        # Explicit arguments: the compiled engine (sim/_compiled.py) does not forward *args to a native base.
        super().__init__(config, num_gpu_blocks, num_cpu_blocks, predicted_output)
        config = self.config
        # vLLM's kv_cache_manager: int(watermark * kv_cache_config.num_blocks), the null block included
        # (the pool here holds the usable num_blocks - 1).
        self.watermark_blocks = int(config.watermark * (self.pool.num_blocks + 1))
        self.reserve_full_isl = bool(config.scheduler_reserve_full_isl)
        self.long_prefill_threshold = config.long_prefill_token_threshold or 0
        self._step_threshold = self.long_prefill_threshold  # this step's cap (set by schedule())
        self.priority_policy = config.scheduling_policy == "priority"
        self.predicted_admission = config.admission_policy == "predicted"

    def schedule(self, now: float) -> SchedulerOutput:
        out = self.new_output()
        if self.loading:
            self._land_loads(now)
        pool = self.pool
        running = self.running
        budget = self.max_num_batched_tokens
        # vLLM drops the long-prefill cap when a single request is in the system (nobody to starve).
        threshold = self.long_prefill_threshold if len(running) + len(self.waiting) > 1 else 0
        self._step_threshold = threshold
        block_size = self.block_size
        hashed = self.blocks_hashed
        all_decode = True
        # ---- running requests ------------------------------------------------------------------------
        # Fast path: the leading decodes in one pass (see _schedule_decode_prefix); the loop goes on from there.
        fcfs_now = None if self.priority_policy else now  # (preempting on the decode columns is FCFS only)
        index = self._schedule_decode_prefix(out, budget, False, self.priority_policy, fcfs_now) if running else 0
        budget -= index
        while index < len(running) and budget > 0:
            req = running[index]
            num_new = req.num_tokens - req.num_computed_tokens
            if threshold and num_new > threshold:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            limit = self.max_model_len - 1 - req.num_computed_tokens
            if num_new > limit:
                num_new = limit
            if num_new <= 0:
                index += 1
                continue
            need = -(-(req.num_computed_tokens + num_new) // block_size) - req.blocks
            scheduled_self = True
            while need > pool.num_free:
                if self.deferred_free:
                    deferred = self._deferred_victim()
                    if deferred is not None:
                        self._preempt_deferred(out, deferred)
                        continue
                victim = self._pick_victim()
                if victim is req:
                    running.remove(req)
                    self._preempt_recompute(out, req, now)
                    scheduled_self = False
                    break
                victim_pos = running.index(victim)
                running.pop(victim_pos)
                if victim_pos < index:
                    # Priority policy can pick a request already scheduled this step: undo its slot.
                    index -= 1
                    budget += self._unschedule(out, victim)
                self._preempt_recompute(out, victim, now)
            if not scheduled_self:
                if self.priority_policy:
                    # It was the lowest-priority request: the ones after it rank higher and may fit now
                    # (vLLM ``continue``s; ``index`` already points at the next one).
                    continue
                break
            pool.allocate(need)
            req.blocks += need
            if hashed:
                # allocate_slots hashes the blocks this step fills (v1/core/kv_cache_manager.py, 0.33.0), up to
                # the tokens the request knows: under async scheduling the token sampled by the previous step is
                # not appended until update_from_output, after this schedule() (see _known_tokens).
                end = req.num_computed_tokens + num_new
                known = self._known_tokens(req, now)
                self._prefix_pool().cache_blocks(req, end if end < known else known)
            if num_new != 1 or req.num_computed_tokens < req.prompt_tokens:
                all_decode = False
            self._account(out, req, num_new)
            budget -= num_new
            index += 1
        all_running_scheduled = index >= len(running)
        # ---- waiting requests (none in a step that preempted) ---------------------------------------------
        if not out.preempted:
            waiting = self.waiting
            # Async scheduling: requests finished by the previous step still count against max_num_seqs.
            max_running = self.max_num_seqs - len(self.deferred_free)
            while len(waiting) and budget > 0 and len(running) < max_running:
                req = waiting.peek()
                admitted = self._admit(out, req, budget, now)
                if admitted is None:
                    # An asynchronous load started: the request waits for it outside the queue (vLLM skips it).
                    waiting.pop()
                    continue
                if not admitted:
                    break
                waiting.pop()
                running.append(req)
                if self.async_scheduling:
                    self.run_seq[req.index] = self.next_seq  # (its place in running: _deferred_victim)
                    self.next_seq += 1
                budget -= out.scheduled[-1][1]
                out.num_admitted += 1
        # A steady decode step opens a run of identical steps (EngineCore._decode_run).  Requests finished by the
        # previous step still hold their slots and blocks here (async scheduling); the next schedule() sees them
        # freed, which can only admit a waiting request (it cannot preempt: more blocks are free), so with
        # nobody waiting this step decides what the run's later steps decide and may open the run.
        out.steady_decode = (
            all_decode and all_running_scheduled and not out.preempted and out.num_admitted == 0
            and out.swap_in_blocks == 0 and bool(out.scheduled)
            and not (self.deferred_free and len(self.waiting))
        )
        return out

    def _take_blocks(self, req: Request, hit_ids: list[int], gpu_hit: int, total: int, computed: int) -> None:
        """``req`` takes its ``gpu_hit`` cached leading blocks and fresh ones up to ``total``."""
        pool = self.pool
        if self.blocks_hashed:
            self._prefix_pool().touch(req, hit_ids)
        elif gpu_hit:
            pool.reuse_cached(req.index, gpu_hit)
        pool.allocate(total - gpu_hit)
        req.blocks = total
        req.num_computed_tokens = computed
        # vLLM records a lookup by a previously preempted request apart (PrefixCacheStats.preempted_hits, not
        # exported); vllm:prefix_cache_hits and the request's num_cached_tokens are the first admission's.
        if req.num_preemptions:
            req.preempted_hit_tokens += gpu_hit * self.block_size
        else:
            req.prefix_hit_tokens += gpu_hit * self.block_size

    def _admit_loaded(self, out: SchedulerOutput, req: Request, budget: int, now: float) -> bool:
        """Admit a request whose load has landed: it holds the blocks of its computed tokens already."""
        num_tokens = req.num_tokens
        computed = req.num_computed_tokens
        num_new = num_tokens - computed
        if self._step_threshold and num_new > self._step_threshold:
            num_new = self._step_threshold
        if num_new > budget:
            num_new = budget
        free = self.pool.num_free
        keep_free = (self.watermark_blocks + self.reserved_blocks) if self.running else 0
        if self.reserve_full_isl and self.blocks_for(num_tokens) - req.blocks + keep_free > free:
            return False
        need = self.blocks_for(computed + num_new) - req.blocks
        if need + keep_free > free:
            return False
        if self.predicted_admission and self.running and not self._predicted_fits(req, free):
            return False
        self.pool.allocate(need)
        req.blocks += need
        if self.blocks_hashed:
            end = computed + num_new
            self._prefix_pool().cache_blocks(req, end if end < num_tokens else num_tokens)
        self._mark_scheduled(req, now)
        self._account(out, req, num_new)
        return True

    def _pick_victim(self) -> Request:
        if self.priority_policy:
            # vLLM (v1/core/sched/scheduler.py): max(running, key=(priority, arrival_time)).  vLLM stamps arrivals
            # one after another, so two never tie; a trace can give equal times, and then two requests that cannot
            # fit together would preempt each other forever (ties go to the first in running order, which is the
            # one ahead).  The arrival index breaks the tie as vLLM's stamps would, as the waiting queue's key does.
            return max(self.running, key=lambda r: (r.priority, r.arrival_s, r.index))
        return self.running[-1]

    def _unschedule(self, out: SchedulerOutput, victim: Request) -> int:
        """Take back a slot given earlier in this step; returns the tokens freed for the budget."""
        for req, num_new in out.scheduled:
            if req is victim:
                self._account(out, victim, num_new, sign=-1)
                return num_new
        return 0

    def _known_tokens(self, req: Request, now: float) -> int:
        """The tokens of a running request that vLLM has appended at this ``schedule()`` (what ``allocate_slots``
        may hash: ``min(computed + new, request.num_tokens)``).  Under async scheduling the token sampled by the
        previous step (whose last token came out at ``now``) is still a placeholder (0.33.0
        v1/core/sched/async_scheduler.py ``num_output_placeholders``); update_from_output appends it after this
        ``schedule()``."""
        if self.async_scheduling and req.last_token_s == now:
            return req.num_tokens - 1
        return req.num_tokens

    def _admit(self, out: SchedulerOutput, req: Request, budget: int, now: float) -> bool | None:
        """Try to admit the head of the waiting queue (v1 scheduler waiting loop + allocate_slots).  ``None``: an
        asynchronous load from the CPU tier was started instead (the request is in ``self.loading``)."""
        if req.blocks:
            return self._admit_loaded(out, req, budget, now)
        pool = self.pool
        block_size = self.block_size
        num_tokens = req.num_tokens
        # Prefix cache: the longest run of leading blocks found in the cache; vLLM always recomputes at least
        # the last token (get_computed_blocks: max_cache_hit_length = num_tokens - 1).
        max_hit = (num_tokens - 1) // block_size
        hit_ids = _NO_HITS
        if self.blocks_hashed:
            # Shared prefixes: blocks keyed by content, possibly computed (or being computed) by other requests.
            prefix_pool = self._prefix_pool()
            hit_ids = prefix_pool.lookup(req, max_hit)
            gpu_hit = len(hit_ids)
            hit_active = gpu_hit - prefix_pool.num_evictable(hit_ids)  # hits on blocks in use cost no free block
        else:
            # Unique prompts: a resumed request re-hits its own surviving full blocks.
            gpu_hit = min(pool.cached_prefix(req.index), max_hit)
            hit_active = 0
        cpu_hit = min(self.cpu.cached_prefix(req.index), max_hit)
        load = cpu_hit - gpu_hit if cpu_hit > gpu_hit else 0
        computed = (gpu_hit + load) * block_size
        num_new = num_tokens - computed
        if self._step_threshold and num_new > self._step_threshold:
            num_new = self._step_threshold
        if num_new > budget:
            num_new = budget
        something_running = bool(self.running)
        free = pool.num_free
        # The watermark and kvtune's reserve/headroom apply only while something runs, so an idle engine
        # always admits (a max-length request fits an empty cache: checked at start-up).
        keep_free = (self.watermark_blocks + self.reserved_blocks) if something_running else 0
        # get_num_blocks_to_allocate: new blocks + hit blocks that are free (those in use cost nothing).
        if self.reserve_full_isl and self.blocks_for(num_tokens) - hit_active + keep_free > free:
            return False
        need = self.blocks_for(computed + num_new)
        if need - hit_active + keep_free > free:
            return False
        if self.predicted_admission and something_running and not self._predicted_fits(req, free):
            return False
        if load and self.load_time is not None:
            # vLLM 0.33 OffloadingConnector: blocks for the hit are allocated and the load runs asynchronously;
            # the request is scheduled once it has landed (WAITING_FOR_REMOTE_KVS).  Its loaded blocks get their
            # hashes then (``_admit_loaded``).
            self._take_blocks(req, hit_ids, gpu_hit, gpu_hit + load, computed)
            req.swapped_in_blocks += load
            out.swap_in_blocks += load  # recorded in the step table, but not on this step's critical path
            req.status = Status.LOADING
            self.loading.append((now + self.load_time(load, load * self.copies_per_block), req))
            return None
        # Admit: cached blocks become used again, the rest are allocated (loaded ones come from the CPU).
        self._take_blocks(req, hit_ids, gpu_hit, need, computed)
        if self.blocks_hashed:
            end = computed + num_new
            self._prefix_pool().cache_blocks(req, end if end < num_tokens else num_tokens)
        if load:
            req.swapped_in_blocks += load
            out.swap_in_blocks += load
            out.swap_copies += load * self.copies_per_block
        self._mark_scheduled(req, now)
        self._account(out, req, num_new)
        return True
