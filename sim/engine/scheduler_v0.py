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

from sim.engine.config import EngineConfig
from sim.engine.request import Request, Status
from sim.engine.scheduler_base import BaseScheduler
from sim.engine.scheduler_output import SchedulerOutput
from sim.errors import EngineAborted

#: block_manager.py: ``watermark: float = 0.01``.
V0_WATERMARK = 0.01


class V0Scheduler(BaseScheduler):
    """The ``vllm-v0`` flavor (fcfs)."""

    def __init__(self, config: EngineConfig, num_gpu_blocks: int, num_cpu_blocks: int,
                 predicted_output: dict[str, int] | None = None):
        # Explicit arguments: the compiled engine (sim/_compiled.py) does not forward *args to a native base.
        super().__init__(config, num_gpu_blocks, num_cpu_blocks, predicted_output)
        self.watermark_blocks = int(V0_WATERMARK * self.pool.num_blocks)
        self.chunked = bool(self.config.enable_chunked_prefill)
        self.swap_mode = self.config.preemption_mode == "swap"
        self.swapped: deque[Request] = deque()
        # A decode step preempts unless each request finds a free block (can_append_slots' touched blocks).
        self.decode_run_free_reserve = 1
        self.cpu_swap_capacity = self.cpu.capacity
        self.cpu_swap_used = 0
        # Without chunking a prompt must fit one step's budget (scheduler.py _get_prompt_limit).
        self.prompt_limit = (
            self.max_model_len if self.chunked else min(self.max_model_len, self.max_num_batched_tokens)
        )

    @property
    def supports_decode_columns(self) -> bool:
        """Without chunked prefill the running order survives a step (``unscheduled + scheduled + swapped_in``
        with nothing unscheduled: decodes have no budget), so the leading decodes can be kept as columns; the
        chunked path reorders running by stage every step."""
        return not self.chunked

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

    def _free(self, req: Request, final: bool = False) -> None:
        if req.status == Status.SWAPPED:
            self.cpu_swap_used -= req.blocks
            req.blocks = 0
            return
        super()._free(req, final)

    # ------------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = self.new_output()
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
        # Without a budget nothing is left unscheduled (the loop stops only when a request preempted itself, the
        # queue empty), so the running order's head stays put: the decode columns rely on it.
        assert not unscheduled
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
        # New running order (scheduler.py _schedule_chunked_prefill): swapped-in, decodes, then prefills, those
        # whose chunk finishes the prompt first (_order_finishing_prefills_first).
        decodes = [r for r in scheduled if r in self._decoding]
        prefills = [r for r in scheduled if r not in self._decoding]
        finishing = [r for r in prefills if self._finishing[r.index]]
        prefills = finishing + [r for r in prefills if not self._finishing[r.index]]
        self.running = unscheduled + swapped_in + decodes + prefills
        admitted_before = out.num_admitted
        self._schedule_prefills(out, now, budget, len(self.running), chunking=True)
        # Recompute-preempted requests rejoin the waiting queue only after this step's prefills were scheduled
        # (``self.waiting.extendleft(running_scheduled.preempted)`` comes after ``_schedule_prefills``).
        for victim in out.preempted:
            if victim.status == Status.WAITING:
                self.waiting.prepend(victim)
        all_decode = out.bulk_decode == len(out.scheduled) or (
            all(n == 1 for _, n in out.scheduled) and all(r.num_computed_tokens >= r.prompt_tokens for r, _ in out.scheduled))
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
            req.appended_tokens = req.num_tokens
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
        # Fast path: the leading decodes in one pass (see _schedule_decode_prefix: a decode touches one block);
        # the loop goes on from there.  They are decodes (in ``_decoding``), so ``_finishing`` is not read.
        count = (self._schedule_decode_prefix(out, len(running) if budget is None else budget, True,
                                              now=None if self.chunked else now) if running else 0)
        # (victims preempted on the decode columns were popped from ``running``, this same list)
        scheduled: list[Request] = running[:count] if count < len(running) else running
        queue = deque(running[count:]) if count < len(running) else deque()
        self.running = []
        # Stage of each scheduled request (vllm/sequence.py: DECODE once its prompt, or recompute, was computed
        # whole: it has a token the block table has not seen), and whether a prefill chunk finishes it.
        # (Read by _schedule_chunked only, to order the running queue: the default order is unchanged, and a set of
        # every scheduled request made at every step was ~10% of the v0-swap case, perf.)
        self._decoding: set[Request] = set(scheduled) if self.chunked else set()
        self._finishing: dict[int, bool] = {}
        pool = self.pool
        used = count
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
            # can_append_slots counts every block the append touches as if it needed a new one (0.8.5
            # block_manager.py "worst-case heuristic"): a decode needs a free block even when its last one
            # has room.
            while self._append_touched(req) > pool.num_free:
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
            if req.num_tokens > req.appended_tokens:
                self._decoding.add(req)
            self._finishing[req.index] = req.num_computed_tokens + num_new >= req.num_tokens
            req.appended_tokens = req.num_tokens
            self._account(out, req, num_new)
            scheduled.append(req)
            used += num_new
        return scheduled, list(queue)

    def _schedule_swapped(self, out: SchedulerOutput, now: float, budget: int, num_seqs: int) -> list[Request]:
        swapped_in: list[Request] = []
        pool = self.pool
        while self.swapped:
            req = self.swapped[0]
            # can_swap_in: the table's full blocks + the blocks the append of its unseen tokens touches.
            touched = req.appended_tokens // self.block_size + self._append_touched(req)
            need = self.blocks_for(req.num_tokens)
            if pool.num_blocks < touched:
                self.swapped.popleft()  # AllocStatus.NEVER
                self._free(req)
                self._end(req, Status.REJECTED, now)
                continue
            if pool.num_free - touched < self.watermark_blocks:
                break  # AllocStatus.LATER
            if budget < 1 or num_seqs + 1 > self.max_num_seqs:
                break
            self.swapped.popleft()
            self.cpu_swap_used -= req.blocks
            moved = req.blocks
            pool.allocate(need)
            req.blocks = need
            req.appended_tokens = req.num_tokens
            req.swapped_in_blocks += moved
            out.swap_in_blocks += moved
            out.swap_copies += moved * self.copies_per_block
            self._mark_scheduled(req, now)
            self._account(out, req, 1)
            swapped_in.append(req)
            budget -= 1
            num_seqs += 1
        return swapped_in

    def _append_touched(self, req: Request) -> int:
        """``BlockTable.get_num_blocks_touched_by_append_slots`` (vllm/core/block/block_table.py, 0.8.5) for the
        tokens not yet in the request's block table: ``1 + ceil((unseen - room in the last block) / block_size)``
        (1 for a decode however much room is left; 0 only when nothing is unseen and the last block is full)."""
        block_size = self.block_size
        slots = req.appended_tokens
        room = block_size - slots % block_size
        return 1 + -(-(req.num_tokens - slots - room) // block_size)

    def _preempt_running(self, out: SchedulerOutput, victim: Request, now: float) -> None:
        self._preempt(out, victim, now)

    def _preempt(self, out: SchedulerOutput, victim: Request, now: float) -> None:
        if not self.swap_mode:
            # Chunked: the victim is requeued after this step's prefills (see _schedule_chunked).
            self._preempt_recompute(out, victim, now, requeue=not self.chunked)
            return
        # scheduler.py _swap_out: "Aborted due to the lack of CPU swap space." (can_swap_out: full blocks + the
        # blocks the append of its unseen tokens touches must fit the free CPU blocks).
        touched = victim.appended_tokens // self.block_size + self._append_touched(victim)
        if self.cpu_swap_capacity - self.cpu_swap_used < touched:
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
