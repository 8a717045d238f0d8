"""vLLM V0's scheduler (vllm/core/scheduler.py and vllm/core/block_manager.py, vLLM 0.8.5.post1).

Default path (no chunked prefill): a step is either prefills (only when nothing is swapped out) or decodes;
decodes preempt the last running sequence when a block is missing; swapped sequences are swapped back in
only in decode steps that preempted nothing.  Chunked path: running first, then swapped, then waiting
prefills, in one token budget.  Admission allocates blocks for the whole sequence and keeps a watermark of
1% of the blocks free; a prompt that could never fit is rejected (``FINISHED_IGNORED``).  Swap preemption
copies the victim's blocks to CPU swap space and aborts the engine when that space runs out.
"""

from __future__ import annotations

from collections import deque

from sim.engine.request import Request, Status
from sim.engine.scheduler_base import BaseScheduler, SchedulerOutput
from sim.errors import EngineAborted

#: block_manager.py: ``watermark: float = 0.01``.
V0_WATERMARK = 0.01


class V0Scheduler(BaseScheduler):
    """The ``vllm-v0`` flavor (fcfs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.watermark_blocks = int(V0_WATERMARK * self.pool.num_blocks)
        self.chunked = bool(self.config.enable_chunked_prefill)
        self.swap_mode = self.config.preemption_mode == "swap"
        self.swapped: deque[Request] = deque()
        self.cpu_swap_capacity = self.cpu.capacity
        self.cpu_swap_used = 0
        # Without chunking a prompt must fit one step's budget (scheduler.py _get_prompt_limit).
        self.prompt_limit = (
            self.max_model_len if self.chunked else min(self.max_model_len, self.max_num_batched_tokens)
        )

    def share_prefixes(self) -> None:
        """The V0 flavor models no cross-request prefix cache: shared prefixes are ignored."""

    def num_swapped(self) -> int:
        return len(self.swapped)

    def live_requests(self):
        yield from super().live_requests()
        yield from self.swapped

    def _drop_swapped(self, req: Request) -> None:
        self.swapped.remove(req)
        self.cpu_swap_used -= req.blocks
        req.blocks = 0

    def _free(self, req: Request) -> None:
        if req.status == Status.SWAPPED:
            self.cpu_swap_used -= req.blocks
            req.blocks = 0
            return
        super()._free(req)

    # ------------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.chunked:
            self._schedule_chunked(out, now)
        else:
            self._schedule_default(out, now)
        return out

    def _schedule_default(self, out: SchedulerOutput, now: float) -> None:
        num_seqs = len(self.running)
        if not self.swapped:
            self._schedule_prefills(out, now, self.max_num_batched_tokens, num_seqs, chunking=False)
        if out.num_admitted:
            return  # "Don't schedule decodes if prefills are scheduled."
        scheduled, unscheduled = self._schedule_running(out, now, budget=None)
        swapped_in: list[Request] = []
        if not out.preempted:
            swapped_in = self._schedule_swapped(out, now, self.max_num_batched_tokens - out.decode_tokens, len(scheduled))
        self.running = unscheduled + scheduled + swapped_in
        out.steady_decode = (
            bool(scheduled) and not unscheduled and not out.preempted and not swapped_in and out.num_admitted == 0
        )

    def _schedule_chunked(self, out: SchedulerOutput, now: float) -> None:
        budget = self.max_num_batched_tokens
        scheduled, unscheduled = self._schedule_running(out, now, budget=budget)
        budget -= sum(n for _, n in out.scheduled)
        swapped_in: list[Request] = []
        if not out.preempted:
            swapped_in = self._schedule_swapped(out, now, budget, len(scheduled))
            budget -= len(swapped_in)
        # New running order (scheduler.py _schedule_chunked_prefill): swapped-in, decodes, prefills.
        decodes = [r for r in scheduled if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in scheduled if r.num_tokens - r.num_computed_tokens != 1]
        self.running = unscheduled + swapped_in + decodes + prefills
        admitted_before = out.num_admitted
        self._schedule_prefills(out, now, budget, len(self.running), chunking=True)
        all_decode = all(n == 1 for _, n in out.scheduled) and all(r.num_computed_tokens >= r.prompt_tokens for r, _ in out.scheduled)
        out.steady_decode = (
            bool(scheduled) and not unscheduled and not out.preempted and not swapped_in
            and out.num_admitted == admitted_before == 0 and all_decode
        )

    # ---- the three queues ------------------------------------------------------------------------------
    def _schedule_prefills(self, out: SchedulerOutput, now: float, budget: int, num_seqs: int, chunking: bool) -> None:
        waiting = self.waiting
        pool = self.pool
        rejected: list[Request] = []
        tokens_used = 0
        while len(waiting):
            req = waiting.peek()
            num_new = req.num_tokens - req.num_computed_tokens
            if num_new > self.prompt_limit:
                waiting.pop()
                rejected.append(req)
                continue
            need = self.blocks_for(req.num_tokens)
            if pool.num_blocks - need < self.watermark_blocks:
                waiting.pop()  # AllocStatus.NEVER
                rejected.append(req)
                continue
            keep_free = self.watermark_blocks + (self.reserved_blocks if self.running else 0)
            if pool.num_free - need < keep_free:
                break  # AllocStatus.LATER
            if self.config.admission_policy == "predicted" and self.running and not self._predicted_fits(req, pool.num_free):
                break
            if chunking:
                num_new = min(num_new, budget - tokens_used)
            if num_new <= 0 or tokens_used + num_new > budget or num_seqs + 1 > self.max_num_seqs:
                break
            waiting.pop()
            pool.allocate(need)
            req.blocks = need
            self._mark_scheduled(req, now)
            self._account(out, req, num_new)
            self.running.append(req)
            tokens_used += num_new
            num_seqs += 1
            out.num_admitted += 1
        for req in rejected:
            self._end(req, Status.REJECTED, now)

    def _schedule_running(self, out: SchedulerOutput, now: float, budget: int | None) -> tuple[list[Request], list[Request]]:
        """Decode (and, chunked, continue prefilling) running sequences in order, preempting the last one when
        a block is missing.  Returns (scheduled, left unscheduled for lack of budget)."""
        running = self.running
        if running and (budget is None or budget >= len(running)) and self._schedule_all_decodes(out):
            # Every one decodes and the free blocks cover them all: nobody is preempted (the loop below would
            # schedule them in order, one token each).
            self.running = []
            return running, []
        queue = deque(self.running)
        self.running = []
        scheduled: list[Request] = []
        pool = self.pool
        used = 0
        while queue:
            req = queue[0]
            num_new = req.num_tokens - req.num_computed_tokens
            if budget is not None:
                num_new = min(num_new, budget - used)
                if num_new <= 0:
                    break
            queue.popleft()
            need = max(0, self.blocks_for(req.num_computed_tokens + num_new) - req.blocks)
            preempted_self = False
            while need > pool.num_free:  # can_append_slots
                if queue:
                    self._preempt(out, queue.pop(), now)
                else:
                    self._preempt(out, req, now)
                    preempted_self = True
                    break
            if preempted_self:
                break
            pool.allocate(need)
            req.blocks += need
            self._account(out, req, num_new)
            scheduled.append(req)
            used += num_new
        return scheduled, list(queue)

    def _schedule_swapped(self, out: SchedulerOutput, now: float, budget: int, num_seqs: int) -> list[Request]:
        swapped_in: list[Request] = []
        pool = self.pool
        while self.swapped:
            req = self.swapped[0]
            need = self.blocks_for(req.num_computed_tokens + 1)
            if pool.num_blocks < need:
                self.swapped.popleft()  # AllocStatus.NEVER
                self._free(req)
                self._end(req, Status.REJECTED, now)
                continue
            if pool.num_free - need < self.watermark_blocks:
                break  # AllocStatus.LATER
            if budget < 1 or num_seqs + 1 > self.max_num_seqs:
                break
            self.swapped.popleft()
            self.cpu_swap_used -= req.blocks
            moved = req.blocks
            pool.allocate(need)
            req.blocks = need
            req.swapped_in_blocks += moved
            out.swap_in_blocks += moved
            out.swap_copies += moved * self.copies_per_block
            self._mark_scheduled(req, now)
            self._account(out, req, 1)
            swapped_in.append(req)
            budget -= 1
            num_seqs += 1
        return swapped_in

    def _preempt(self, out: SchedulerOutput, victim: Request, now: float) -> None:
        if not self.swap_mode:
            self._preempt_recompute(out, victim, now)
            return
        # scheduler.py _swap_out: "Aborted due to the lack of CPU swap space."
        if self.cpu_swap_capacity - self.cpu_swap_used < victim.blocks:
            raise EngineAborted(
                f"swap preemption of request {victim.request_id} needs {victim.blocks} CPU blocks but only "
                f"{self.cpu_swap_capacity - self.cpu_swap_used} of {self.cpu_swap_capacity} are free: vLLM aborts "
                "(\"Aborted due to the lack of CPU swap space\"); raise swap_space_gb"
            )
        self.pool.release(victim.index, victim.blocks, 0)
        self.cpu_swap_used += victim.blocks
        victim.swapped_out_blocks += victim.blocks
        out.swap_out_blocks += victim.blocks
        out.swap_copies += victim.blocks * self.copies_per_block
        victim.num_preemptions += 1
        victim.preempted_at = now
        victim.stall(now)
        victim.status = Status.SWAPPED
        self.swapped.append(victim)
        out.preempted.append(victim)
