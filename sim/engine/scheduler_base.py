"""What both scheduler flavors share: queues, the step's bookkeeping, finishing, aborting and preemption.

The step's output (:class:`SchedulerOutput`, :func:`split_tokens`) is in ``sim/engine/scheduler_output.py`` and the
waiting queue (:class:`WaitingQueue`) in ``sim/engine/waiting_queue.py``; both are importable from here as before.

The split follows vLLM's v1 core (vllm/v1/core/sched/scheduler.py): ``schedule()`` decides what runs in a
step; ``update_from_output()`` applies the step's result once the latency model has said how long it took.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Final, cast

import numpy as np
from mypy_extensions import i64

from sim.engine.config import EngineConfig
from sim.engine.decode_columns import DecodeColumns
from sim.engine.kv_cache import CpuBlockTier, GpuBlockPool
from sim.engine.prefix_pool import PrefixBlockPool
from sim.engine.request import Request, Status
from sim.engine.scheduler_output import SchedulerOutput, split_tokens
from sim.engine.waiting_queue import WaitingQueue

#: Smallest segment the decode columns take on.  Their per-step work is a few compiled calls
#: (sim/engine/_column_kernels.py, ~1 us each), but joining and writing back cost Python per request, so a
#: small batch stays on Request objects.  Measured (``taskset -c 1 python benchmarks/sim_speed.py --no-profile
#: --repeats 5``, CPU s, minimum 192 / 48 / 24): incident 1.96 / 0.77 / 0.76, overload-4x 0.59 / 0.43 / 0.42,
#: reasoning 2.53 / 1.88 / 1.87, prefix 2.63 / 1.67 / 1.68, 1x 3.52 / 3.64 / 3.78.  48 rather than a lower value:
#: the bundled trace's batch (1x on H100) peaks at 32, and loading the kernels costs ~1 s of a 4 s ``simulate``.
DECODE_COLUMNS_MIN = 48
#: Steady decodes that join an existing segment together (fewer wait in the object path: a join costs a few
#: numpy calls whatever its size).
DECODE_COLUMNS_JOIN: Final = 4  # (Final: a C static, see prefix_pool._NO_IDS)


def _victim_key(req: Request) -> tuple[int, float, int]:
    """The priority policy's victim order (V1Scheduler._pick_victim): the max is preempted first."""
    return (req.priority, req.arrival_s, req.index)


class BaseScheduler(ABC):
    """Queues and accounting common to the V0 and V1 flavors."""

    @property
    def supports_decode_columns(self) -> bool:
        """Whether the flavor's running loop allows decode columns (see :meth:`use_decode_columns`)."""
        return False

    def __init__(
        self,
        config: EngineConfig,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        predicted_output: dict[str, int] | None = None,
    ):
        self.config = config
        self._block_size = 0
        self._block_shift: i64 = -1
        self._block_mask: i64 = -1
        self.block_size = config.block_size  # (the setter below: sets the shift and mask too)
        # A resolved config (EngineConfig.resolve) has these set: typed int here, not the knobs' int | None.
        self.max_num_seqs: int = cast(int, config.max_num_seqs)
        self.max_num_batched_tokens: int = cast(int, config.max_num_batched_tokens)
        self.max_model_len: int = cast(int, config.max_model_len)
        self.pool: GpuBlockPool | PrefixBlockPool = GpuBlockPool(num_gpu_blocks, bool(config.enable_prefix_caching))
        #: Free blocks a batched decode run must leave after each of its steps (see EngineCore._decode_run).
        self.decode_run_free_reserve = 0
        #: The pool tracks hashed blocks one by one (shared prefixes; see :meth:`share_prefixes`).
        self.blocks_hashed = False
        self.cpu = CpuBlockTier(num_cpu_blocks)
        self.waiting = WaitingQueue(priority=config.scheduling_policy == "priority")
        self.running: list[Request] = []
        self.reserved_blocks = int(config.reserved_kv_fraction * num_gpu_blocks)
        self.headroom_blocks = int(config.admission_headroom * num_gpu_blocks)
        self.predicted_output = predicted_output or {}
        self.finished: list[Request] = []
        #: When a list (a fleet whose router follows its requests, ``sim.fleet``): each request is appended to it
        #: at its first token and at its end, as they happen, so the router is told of them without a walk over
        #: every request in flight.
        self.news: list[Request] | None = None
        #: Host-link copy calls per block moved (V0 copies each block per layer for K and V; set by the core).
        self.copies_per_block = 1
        #: vLLM's AsyncScheduler (0.33 v1/engine/core.py step_with_batch_queue): schedule(N+1) runs before
        #: update_from_output(N), so a request finished by step N still holds its blocks and its running slot
        #: while step N+1 is scheduled.  Such requests wait here until the engine core has run that schedule().
        self.async_scheduling = bool(getattr(config, "async_scheduling", False))
        self.deferred_free: list[Request] = []
        #: Async scheduling: each running request's place in vLLM's ``running`` list (admission order), which
        #: still holds the requests in ``deferred_free``: a victim search may pick one (:meth:`_deferred_victim`).
        self.run_seq: dict[int, int] = {}
        self.next_seq = 0
        #: The decode columns' scheduled entries while an abort comes between ``schedule()`` and the update (async
        #: scheduling, set by the engine core): their blocks for this step's token are allocated already.
        self.columnar_in_flight = 0
        #: vLLM 0.33's OffloadingConnector (V1 CPU offload) stores write-through: every scheduled request's newly
        #: full blocks are copied to the CPU tier after the step, on a separate stream that overlaps compute
        #: (distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, store jobs built each step), into an
        #: LRU over all requests' blocks (v1/kv_offload/cpu/policies/lru.py).
        self.write_through = config.is_v1 and num_cpu_blocks > 0
        #: Loads from the CPU tier are asynchronous (OffloadingConnector.get_num_new_matched_tokens returns
        #: load_kv_async): the request holds its blocks in Status.LOADING and is scheduled in a step after the
        #: load has landed, instead of the load's time being charged to everyone in the step.  ``load_time``
        #: (blocks, copies) -> seconds is set by the engine builder from the latency model.
        self.load_time: Callable[[int, int], float] | None = None
        #: Called with (request, status, now) when :meth:`abort` starts: instrumentation (conformance) that would
        #: otherwise wrap the method, which the compiled engine (sim/_compiled.py) calls directly.
        self.abort_hook: Callable[[Request, Status, float], None] | None = None
        self.loading: list[tuple[float, Request]] = []
        #: The running batch's leading steady decodes as arrays (off unless :meth:`use_decode_columns`).
        self._columns: DecodeColumns | None = None
        self._columns_min = DECODE_COLUMNS_MIN
        #: An applied output handed back by the engine core (:meth:`recycle`), for the next ``schedule()``.
        self._spare: SchedulerOutput | None = None

    @property
    def block_size(self) -> int:
        """Tokens per KV block.  Set through the setter, which keeps ``_block_shift`` (``log2`` of a power-of-two
        size, else -1) and ``_block_mask`` (size - 1 for a power of two, else -1) with it: the run loops take a
        request's blocks and residues with them where vLLM's block sizes (powers of two) allow, since the
        compiled engine's i64 ``//`` and ``%`` are calls."""
        return self._block_size

    @block_size.setter
    def block_size(self, value: int) -> None:
        self._block_size = value
        power_of_two = value > 0 and value & (value - 1) == 0
        self._block_shift = value.bit_length() - 1 if power_of_two else -1
        self._block_mask = value - 1 if power_of_two else -1

    def share_prefixes(self) -> None:
        """Some requests' prompts share prefixes (trace ``hash_ids``) and the prefix cache is on: switch to the
        block-by-block pool.  Called by the run loop before the first request arrives."""
        if not self.blocks_hashed:
            self.pool = PrefixBlockPool(self.pool.num_blocks, self.block_size)
            self.blocks_hashed = True

    def _prefix_pool(self) -> PrefixBlockPool:
        """The pool as the shared-prefix pool (``blocks_hashed``), typed so that the compiled engine calls its methods
        directly: through ``self.pool`` (typed either pool) a method the plain pool lacks, ``cache_blocks``, was a
        bound method made and called through the interpreter's protocol, its arguments boxed (~2% of a cold prefix
        run, callgrind)."""
        return cast(PrefixBlockPool, self.pool)

    # ---- queries ---------------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def has_unfinished(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or self.num_swapped() > 0 or bool(self.loading)

    def next_load_ready_s(self) -> float:
        """When the earliest asynchronous load lands (inf if none): an event for the run loop."""
        return min(ready for ready, _ in self.loading) if self.loading else math.inf

    def _land_loads(self, now: float) -> None:
        """Loads that have landed: their requests rejoin the front of the waiting queue, in arrival order."""
        landed = [r for ready, r in self.loading if ready <= now]
        if not landed:
            return
        self.loading = [(ready, r) for ready, r in self.loading if ready > now]
        for req in sorted(landed, key=lambda r: (r.arrival_s, r.index), reverse=True):
            req.status = Status.WAITING
            self.waiting.prepend(req)

    def num_swapped(self) -> int:
        return 0

    def live_requests(self):
        yield from self.running
        yield from self.waiting

    def arrivals_join_blocked_queue(self) -> bool:
        """After a steady decode step (nothing admitted, nothing preempted): would a new arrival leave the next
        steps' decisions unchanged until a request finishes or a deadline passes?  Yes under FCFS with a
        request already waiting: admission is head-of-line, and what stopped the head (no free slot, token
        budget or blocks; free blocks only shrink along a decode run) holds until a request leaves.  An arrival
        joins the back of the queue and is never looked at meanwhile."""
        return not self.waiting.priority and len(self.waiting) > 0

    # ---- the two halves of a step ----------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> None:
        if req.prompt_tokens >= self.max_model_len:
            # vLLM rejects such a prompt at the API (v1/engine/processor.py _validate_model_input).
            self._end(req, Status.REJECTED, now)
            return
        self.waiting.add(req)

    @abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide this step's batch, allocating blocks and preempting as vLLM would."""

    def new_output(self) -> SchedulerOutput:
        """The output a ``schedule()`` fills: the one handed back by :meth:`recycle`, reset, else a new one."""
        out = self._spare
        if out is None:
            return SchedulerOutput()
        self._spare = None
        out.reset()
        return out

    def recycle(self, out: SchedulerOutput) -> None:
        """``out`` was applied (``update_from_output``) and nobody keeps it: the next :meth:`new_output` may reset and
        reuse it.  (It stays as it is until then: a caller may still read it after the step, as ``replay``'s twin
        engine does.)"""
        self._spare = out

    def update_from_output(
        self, out: SchedulerOutput, end_s: float, num_steps: int = 1, first_end_s: float = 0.0, last_gap_s: float = 0.0,
        attribute: bool = False, per_new: float = 0.0, per_rec: float = 0.0, per_dec: float = 0.0,
        overhead: float = 0.0,
    ) -> int:
        """Apply ``num_steps`` identical steps of ``out`` ending at ``end_s``: computed tokens advance, a token
        is sampled for every request whose scheduled tokens reach its end, finished requests free blocks.
        A run's first step ends at ``first_end_s`` and its last lasts ``last_gap_s`` (its longest, step times
        only grow along a run): the inter-token gaps.
        With ``attribute`` (the engine core attributes step time to requests, ``core._shares``): ``per_new``,
        ``per_rec`` and ``per_dec`` are the seconds per new-prefill, recompute and decode token and ``overhead``
        per scheduled request of the step, or of the whole run (a run's decode share is then per request, not per
        token); each request's ``time_*_s`` grow by them.  (Four floats, not a tuple: the compiled engine passes
        them as C doubles, where a tuple was four boxed floats made, unboxed and freed per step.)
        Returns the blocks a run of decode steps grew by after its first step (the engine core checked they
        are free); 0 for a single step, whose blocks ``schedule()`` allocated."""
        done: list[Request] = []
        grown: i64 = 0
        scheduled = out.scheduled
        bulk = out.bulk_decode
        if num_steps > 1:
            # A run of pure decode steps: every request advances num_steps tokens (kept apart: hot path).
            block_size = self.block_size
            # A request's blocks, ``-(-computed // block_size)``, as ``(computed + B - 1) >> log2(B)`` when the block
            # size is a power of two (vLLM's are): the compiled engine's i64 ``//`` is a call per request per run.
            shift = self._block_shift
            round_up: i64 = block_size - 1
            # The bulk entries' processed tokens were left to this method; the others' first was counted by
            # ``_account`` at schedule time.
            cols, ncol = self._columns, out.columnar
            crossed = None
            if ncol:
                # Fast path: the decode columns advance in one compiled pass (the loop below is the slow path).
                grown, crossed = cols.advance(end_s, num_steps, first_end_s, last_gap_s,
                                              per_dec if attribute else None, overhead)
            # (No copy of ``scheduled`` when the bulk entries are all of it, as they are in a steady decode run.)  The
            # two segments, the bulk entries (``num_steps`` processed tokens each) and the rest (one fewer: their first
            # was counted at schedule time), picked by index: a tuple of (segment, extra) pairs was iterated through
            # the interpreter's iterator protocol per run.
            for part in range(2):
                if part == 1 and bulk >= len(scheduled):
                    break  # (no rest: no empty slice made)
                segment = cast(list[tuple], (scheduled if not ncol and bulk == len(scheduled) else scheduled[ncol:bulk])
                               if part == 0 else scheduled[bulk:])
                extra = num_steps if part == 0 else num_steps - 1
                for entry in segment:  # (the request only: see the single-step loop below)
                    req: Request = entry[0]
                    # Gaps: from its previous token to the run's first, then each step (the last is the longest).
                    gap = first_end_s - req.last_token_s
                    if gap < last_gap_s:
                        gap = last_gap_s
                    if not gap <= req.max_itl_s:
                        req.max_itl_s = gap
                    req.last_token_s = end_s
                    computed = req.num_computed_tokens + num_steps
                    req.num_computed_tokens = computed
                    req.high_water = computed
                    req.num_output_tokens += num_steps
                    req.processed_tokens += extra
                    req.appended_tokens = computed  # V0 block table: each step appended the previous token
                    blocks = (computed + round_up) >> shift if shift >= 0 else -(-computed // block_size)
                    grown += blocks - req.blocks
                    req.blocks = blocks
                    if blocks > req.kv_blocks_peak:
                        req.kv_blocks_peak = blocks
                    if attribute:
                        req.time_decode_s += per_dec
                        req.time_overhead_s += overhead
                    if req.num_output_tokens >= req.max_output:
                        done.append(req)
            self.pool.allocate(grown)
            if self.blocks_hashed:
                # Each step of the run hashed the block it filled (allocate_slots); no lookup came between.  Under
                # async scheduling each was one step late: the last step's block is hashed at the next schedule().
                prefix_pool = self._prefix_pool()
                late = 1 if self.async_scheduling else 0
                if ncol:
                    col_computed = cols.computed  # (not ``computed``, an int above: the compiled engine types locals)
                    for i in crossed.tolist():
                        prefix_pool.cache_blocks(cols.requests[i], int(col_computed[i]) - late)
                for entry in cast(list[tuple], scheduled[ncol:]):
                    req = entry[0]
                    prefix_pool.cache_blocks(req, req.num_computed_tokens - late)
            if self.write_through:
                self._store_run_blocks(out, num_steps)  # (before finished requests leave the columns)
            if ncol:
                done[:0] = self._columns_finished()
        else:
            ncol = out.columnar
            if ncol:
                # Fast path: the decode columns advance in one compiled pass (the loops below are the slow path).
                cols = self._columns
                cols.advance(end_s, 1, 0.0, 0.0, per_dec if attribute else None, overhead if attribute else None)
                if self.write_through:
                    self._store_segment_blocks(out)  # (before finished requests leave the columns)
                done.extend(self._columns_finished())
            if bulk > ncol:
                # The decode fast path's entries (leading ``scheduled``): each decoded one token and had
                # computed >= prompt and >= high_water, so none is a prefill chunk or a first token.  The same
                # updates as the general loop below, without its branches.
                # (Each entry is read as a plain tuple and only its request taken: unpacked as ``req, one``, the
                # compiled engine converted every entry to its native (Request, int) pair first, checking both
                # items' types and unboxing the count, for every request of every step.)
                for entry in cast(list[tuple], scheduled if bulk == len(scheduled) and not ncol
                                  else scheduled[ncol:bulk]):
                    req = entry[0]
                    computed = req.num_computed_tokens + 1
                    req.num_computed_tokens = computed
                    req.high_water = computed
                    req.appended_tokens = computed  # V0: what _schedule_running sets at schedule time
                    req.processed_tokens += 1
                    if req.blocks > req.kv_blocks_peak:
                        req.kv_blocks_peak = req.blocks
                    gap = end_s - req.last_token_s
                    if not gap <= req.max_itl_s:
                        req.max_itl_s = gap
                    req.last_token_s = end_s
                    if req.stalled_since == req.stalled_since:
                        req.end_stall(end_s)
                    if attribute:
                        req.time_decode_s += per_dec
                        req.time_overhead_s += overhead
                    produced: i64 = req.num_output_tokens + 1
                    req.num_output_tokens = produced
                    if produced >= req.max_output:
                        done.append(req)
            if bulk < len(scheduled):
                rest = scheduled[bulk:] if bulk else scheduled
                if attribute:
                    for (req, _), (new, rec, dec) in zip(rest, out.splits):
                        req.time_prefill_new_s += new * per_new
                        req.time_recompute_s += rec * per_rec
                        req.time_decode_s += dec * per_dec
                        req.time_overhead_s += overhead
                for req, num_new in rest:
                    computed = req.num_computed_tokens + num_new
                    req.num_computed_tokens = computed
                    if computed > req.high_water:
                        req.high_water = computed
                    if req.blocks > req.kv_blocks_peak:
                        req.kv_blocks_peak = req.blocks
                    if computed < req.prompt_tokens + req.num_output_tokens:
                        continue  # a prefill chunk that did not reach the end: no token sampled
                    req.num_output_tokens += 1
                    if req.num_output_tokens == 1:
                        req.first_token_s = req.last_token_s = end_s
                        req.end_stall(end_s)  # preempted before its first token
                        if self.news is not None:
                            self.news.append(req)
                    else:
                        gap = end_s - req.last_token_s  # inline Request.token_out: the hot path
                        if not gap <= req.max_itl_s:
                            req.max_itl_s = gap
                        req.last_token_s = end_s
                        if req.stalled_since == req.stalled_since:
                            req.end_stall(end_s)
                    if req.num_output_tokens >= req.max_output:
                        done.append(req)
            if self.write_through:
                self._store_computed_blocks(out, out.columnar)
        for req in done:
            # A request whose last token comes out of the step that crosses its client deadline is finished:
            # vLLM 0.33.0 applies the step's output (v1/core/sched/scheduler.py update_from_output) before the
            # abort, which the engine core takes between steps (Scheduler.finish_requests).
            remove_same(self.running, req)  # (``self.running.remove(req)``, by identity)
            if self.async_scheduling:
                self.deferred_free.append(req)
            else:
                self._free(req, True)
            self._end(req, Status.FINISHED, end_s)
        return grown

    def _columns_finished(self) -> list[Request]:
        """Segment requests whose last token came out: written back and taken out of the columns, in order."""
        cols = self._columns
        positions = cols.finished()
        if not positions:
            return []
        cols.sync(positions)
        reqs = cols.requests
        done = [reqs[i] for i in positions]
        cols.drop(positions)
        return done

    def _store_computed_blocks(self, out: SchedulerOutput, skip: int = 0) -> None:
        """Write-through offload: the full computed blocks of every request of the step go to the CPU tier (the
        copies overlap compute, so the step's duration does not include them), in the step's order (the tier
        is an LRU).  The first ``skip`` entries are the decode columns', stored already by
        :meth:`_store_segment_blocks` (their Request attributes are stale).  The step counts its copies; each
        request's are counted in the tier until it ends (:meth:`settle`)."""
        block_size: i64 = self.block_size
        shift = self._block_shift  # (full blocks as ``computed >> log2(B)`` for a power of two: no i64 ``//`` call)
        cpu = self.cpu
        capacity: i64 = cpu.capacity
        if capacity <= 0:
            return
        # (Each entry read as a plain tuple and only its request taken, as update_from_output reads them.)
        entries = cast(list[tuple], out.scheduled[skip:] if skip else out.scheduled)
        # The step's blocks as ``CpuBlockTier.store_step`` sums them (each request's ``min(full, capacity)``).
        blocks: i64 = 0
        for entry in entries:
            req: Request = entry[0]
            if req.blocks:
                computed: i64 = req.num_computed_tokens
                full = computed >> shift if shift >= 0 else computed // block_size
                if full > 0:
                    blocks += full if full < capacity else capacity
        if blocks > capacity:
            # Fast path: ``store_step``'s own for blocks beyond the capacity, its keys stored one after the other
            # (``CpuBlockTier.put``), here without the lists of boxed request indices and counts it takes (a request
            # index is above 256, so each was a new int, per stored request per step: ~10% of an offload run,
            # callgrind).  The slow path, for the rest, is the lists below.
            stored: i64 = 0
            for entry in entries:
                req = entry[0]
                if req.blocks:
                    computed = req.num_computed_tokens
                    stored += cpu.put(req.index, computed >> shift if shift >= 0 else computed // block_size)
            out.swap_out_blocks += stored
            return
        keys: list[int] = []
        fulls: list[int] = []
        for entry in entries:
            req = entry[0]
            if req.blocks:
                keys.append(req.index)
                computed = req.num_computed_tokens
                fulls.append(computed >> shift if shift >= 0 else computed // block_size)
        if keys:
            out.swap_out_blocks += cpu.store_step(keys, fulls)

    def _store_segment_blocks(self, out: SchedulerOutput) -> None:
        """:meth:`_store_computed_blocks` for the decode columns, the step's leading entries (they hold blocks),
        from the arrays."""
        cols = self._columns
        out.swap_out_blocks += self.cpu.store_step(cols.index, cols.computed // self.block_size)

    def _store_run_blocks(self, out: SchedulerOutput, num_steps: int) -> None:
        """The stores of a run of ``num_steps`` decode steps (after its update), one per step as single steps make
        them (:meth:`_store_segment_blocks`, then :meth:`_store_computed_blocks`): a tier that holds fewer blocks
        than the batch evicts at each step what the next step copies again."""
        cols = self._columns
        rest = [req for req, _ in out.scheduled[out.columnar:] if req.blocks]
        keys = np.fromiter((req.index for req in rest), dtype=np.int64, count=len(rest))
        tokens = np.fromiter((req.num_computed_tokens for req in rest), dtype=np.int64, count=len(rest))
        if out.columnar:
            keys, tokens = np.concatenate((cols.index, keys)), np.concatenate((cols.computed, tokens))
        block_size = self.block_size
        cpu = self.cpu
        # Step j of the run had computed ``tokens - (num_steps - j)``.
        out.swap_out_blocks += cpu.store_step(keys, (tokens - (num_steps - 1)) // block_size)
        if num_steps > 1:
            # Fast path: the later steps store the batch again in the same order, each count growing, so one store of
            # the last step's counts leaves the tier as they would where ``CpuBlockTier.restore`` applies; else the
            # loop below stores them step by step.
            last = cpu.restore(keys.tolist(), (tokens // block_size).tolist())
            if last >= 0:
                out.swap_out_blocks += last
                return
            for back in range(num_steps - 2, -1, -1):
                out.swap_out_blocks += cpu.store_step(keys, (tokens - back) // block_size)

    def settle(self, req: Request) -> None:
        """Write to ``req`` what is counted outside it: the blocks copied to the CPU tier for it
        (``Request.swapped_out_blocks``).  Done when it ends, and by the runner for requests still live at the
        end of the run."""
        if self.cpu.capacity > 0:
            req.swapped_out_blocks += self.cpu.take_copied(req.index)

    def flush_deferred(self) -> bool:
        """Free the blocks of requests that finished in the previous step (async scheduling); True if any."""
        if not self.deferred_free:
            return False
        hashed = self.blocks_hashed
        for req in self.deferred_free:
            if hashed:
                # update_from_output hashes a running request's computed blocks before it stops it (0.33.0
                # v1/core/sched/scheduler.py: cache_blocks(request, num_computed_tokens - num_in_flight_tokens)
                # with output placeholders): the block its last step filled, which no schedule() hashed.
                self._prefix_pool().cache_blocks(req, req.num_computed_tokens)
            self._free(req, True)
        self.deferred_free.clear()
        return True

    # ---- shared mechanics ------------------------------------------------------------------------------
    def abort(self, req: Request, status: Status, now: float) -> None:
        """The client went away (timeout or cancel): free its blocks now and record the status."""
        running = req.status == Status.RUNNING
        if running:
            cols = self._columns
            if cols is not None and len(cols):
                # Out of the decode columns first, its state written back (before the hook reads it).
                for i, r in enumerate(cols.requests):
                    if r is req:
                        cols.sync([i], self.columnar_in_flight)
                        cols.drop([i])
                        break
        if self.abort_hook is not None:
            self.abort_hook(req, status, now)  # before anything else changes (see abort_hook)
        if running:
            self.running.remove(req)
        elif req.status == Status.WAITING:
            self.waiting.remove(req)
        elif req.status == Status.SWAPPED:
            self._drop_swapped(req)
        elif req.status == Status.LOADING:
            self.loading = [(ready, r) for ready, r in self.loading if r is not req]
        else:
            return
        self._free(req, True)
        self._end(req, status, now)

    def _drop_swapped(self, req: Request) -> None:
        raise NotImplementedError

    def _free(self, req: Request, final: bool = False) -> None:
        """Give back ``req``'s blocks; ``final``: it has ended (finished or aborted), so the shared-prefix pool may
        keep its own blocks as one entry (``PrefixBlockPool.free``)."""
        if self.async_scheduling:
            self.run_seq.pop(req.index, None)
        if self.blocks_hashed:
            self._prefix_pool().free(req, final)
        elif req.blocks:
            self.pool.release(req.index, req.blocks, req.num_computed_tokens // self.block_size)
            req.blocks = 0

    def _end(self, req: Request, status: Status, now: float) -> None:
        req.status = status
        req.decode_entry = None  # (it refers to the request: freed with it, not by the cyclic collector)
        req.end_s = now
        req.end_stall(now)  # ended while preempted: the stall lasted until then
        self.settle(req)
        self.finished.append(req)
        if self.news is not None:
            self.news.append(req)

    def _account(self, out: SchedulerOutput, req: Request, num_new: int, sign: int = 1) -> None:
        """Record ``num_new`` scheduled tokens of ``req`` (``sign=-1`` takes them back): split into new
        prefill, recompute and decode, and add their compute and KV reads to the step's shape."""
        computed = req.num_computed_tokens
        end = computed + num_new
        if num_new == 1 and computed >= req.prompt_tokens and computed >= req.high_water:
            prefill_new, recompute, decode = 0, 0, 1  # a decode: split_tokens' answer without its calls
        else:
            prefill_new, recompute, decode = split_tokens(req, num_new)
        out.prefill_tokens_recompute += sign * recompute
        out.prefill_tokens_new += sign * prefill_new
        out.decode_tokens += sign * decode
        req.recomputed_tokens += sign * recompute
        req.processed_tokens += sign * num_new
        shape = out.shape
        shape.num_seqs += sign
        if num_new == 1 and computed >= req.prompt_tokens:
            shape.num_decode += sign
            shape.decode_context += sign * end
        else:
            shape.prefill_tokens += sign * num_new
            # (Converted to float explicitly, as Python's int-float operations convert: the compiled engine then
            # works on C doubles, where the mixed operands went through the interpreter's PyNumber_* per chunk.)
            shape.prefill_attention += float(sign * num_new) * (float(computed) + num_new / 2)
            shape.prefill_context += sign * end
            if recompute:
                shape.recompute_tokens += sign * recompute
                shape.recompute_attention += float(sign * recompute) * (float(computed) + recompute / 2)
                shape.recompute_context += sign * (computed + recompute)
        if sign > 0:
            out.scheduled.append((req, num_new))
            out.splits.append((prefill_new, recompute, decode))
        else:
            # Only entries after the bulk ones are taken back (the fast path is whole-batch under priority).
            position = out.scheduled.index((req, num_new))
            assert position >= out.bulk_decode, "a fast-path entry taken back"
            del out.scheduled[position]
            del out.splits[position - out.bulk_decode]

    def _mark_scheduled(self, req: Request, now: float) -> None:
        """First scheduling, or a resume after preemption (the wait since the preemption is accounted)."""
        if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first time
            req.first_scheduled_s = now
        if req.preempted_at == req.preempted_at:  # not NaN: resuming
            req.resume_wait_s += now - req.preempted_at
            req.preempted_at = float("nan")
        req.status = Status.RUNNING

    def _preempt_recompute(self, out: SchedulerOutput, victim: Request, now: float, requeue: bool = True) -> None:
        """Free the victim's blocks (cached with prefix caching, offloaded with a CPU tier) and requeue it at
        the front with nothing computed (v1/core/sched/scheduler.py ``_preempt_request``)."""
        if (self.async_scheduling and not self.blocks_hashed and victim.blocks and victim.last_token_s == now
                and victim.num_output_tokens > 1 and victim.num_computed_tokens > victim.prompt_tokens):
            # Async scheduling: a decode's newest full block got its hash at this schedule() (allocate_slots) or
            # at the previous step's update_from_output, both after this preemption: it is freed uncached.
            # (The prefix pool hashes blocks one by one: see V1Scheduler._known_tokens.)
            self._release_lagging(victim)
        if not self.write_through:  # write-through already stored the victim's computed blocks
            full = victim.num_computed_tokens // self.block_size
            stored = self.cpu.offload(victim.index, full)  # (counted for the victim in the tier: settle)
            if stored:
                out.swap_out_blocks += stored
                out.swap_copies += stored * self.copies_per_block
        self._free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.preempted_at = now
        victim.stall(now)
        victim.status = Status.WAITING
        if requeue:
            self.waiting.prepend(victim)
        out.preempted.append(victim)

    def _deferred_victim(self) -> Request | None:
        """A request finished by the previous step that vLLM's victim search picks before ``running``'s own
        (async scheduling, vLLM 0.33.0 v1/core/sched/scheduler.py ``schedule``: ``self.running[-1]``, or the
        max of ``(priority, arrival_time)``): until update_from_output, after this ``schedule()``, it is still
        in vLLM's ``running``, at its admission place.  None if ``running``'s own victim comes first."""
        deferred = self.deferred_free
        if not deferred:
            return None
        running = self.running
        if self.waiting.priority:
            best = max(deferred, key=_victim_key)
            if running and _victim_key(max(running, key=_victim_key)) > _victim_key(best):
                return None
            return best
        seq = self.run_seq
        best = max(deferred, key=lambda r: seq.get(r.index, -1))
        if running and seq.get(running[-1].index, -1) > seq.get(best.index, -1):
            return None
        return best

    def _preempt_deferred(self, out: SchedulerOutput, victim: Request) -> None:
        """Preempt a request finished by the previous step (see :meth:`_deferred_victim`): its blocks are freed now
        (its last block unhashed: update_from_output hashes only a running request's blocks) and it counts a
        preemption; its output, delivered as stale, still finishes it (0.33.0 ``update_from_output``)."""
        self.deferred_free.remove(victim)
        self.run_seq.pop(victim.index, None)
        if self.blocks_hashed:
            self._prefix_pool().free(victim)
        elif victim.blocks:
            if victim.num_output_tokens > 1 and victim.num_computed_tokens > victim.prompt_tokens:
                self._release_lagging(victim)
            else:
                self._free(victim)
        victim.num_preemptions += 1
        out.preempted.append(victim)

    def _release_lagging(self, victim: Request) -> None:
        """Free a preempted decode's blocks with its newest computed token's block left unhashed (async)."""
        self.pool.release(victim.index, victim.blocks, (victim.num_computed_tokens - 1) // self.block_size)
        victim.blocks = 0

    def _schedule_decode_prefix(self, out: SchedulerOutput, limit: int, touch_one: bool, whole: bool = False,
                                now: float | None = None) -> int:
        """Fast path, both flavors: schedule the leading running requests that decode one token each, as far as
        the general loop (V1 ``schedule``, V0 ``_schedule_running``) would schedule them without preempting
        anyone, and return how many (0: nothing changed).  The general loop then goes on from there.

        Same decisions as the general loop, which for each request in order takes the blocks its token
        crosses into, preempting from the back while they do not fit: a leading decode is scheduled without a
        preemption as long as the blocks of the decodes before it and its own fit the free blocks (V1:
        ``need > num_free``), or, with ``touch_one`` (V0's can_append_slots: every decode needs a free block,
        see V0Scheduler._append_touched), as long as a free block is left after the decodes before it.  Block
        allocation is count-only (allocating a sum is allocating its parts in order).  At most ``limit``
        requests (the token budget); with ``whole``, all of them or none (the priority policy may preempt a
        request scheduled earlier in the step, which the general loop must then take back).  The entries'
        token split is (0, 0, 1), their processed tokens are counted by update_from_output, and they are
        the first entries of ``out.scheduled``.

        With decode columns (:meth:`use_decode_columns`), the segment of running requests kept as arrays leads
        the prefix: it is checked and scheduled with one compiled pass (its requests are steady decodes by
        construction, so only its block demand is checked), and the steady decodes the loop finds after it
        join it.  A segment that does not fit whole, or the budget, is written back first (the loop then
        finds where the general loop would stop).  Given ``now`` (FCFS), a segment request whose block does not
        fit first preempts from the back as the general loop would (:meth:`_preempt_for_columns`), so that only
        the victims are written back, not the rest of the segment."""
        running = self.running
        # The loop's counts are ``i64`` (machine integers in the compiled engine: no tag checks or reference counts per
        # operation, as Python ints have; the same values, far below 2**63): it runs per running request per step,
        # and these locals took ~5% of a cold reasoning run's instructions off (callgrind).
        block_size: i64 = self.block_size
        free: i64 = self.pool.num_free
        need: i64 = 0
        context: i64 = 0
        min_remaining: i64 = 1 << 62
        cols = self._columns
        seg = 0
        if cols is not None and len(cols):
            seg = len(cols)
            if seg < self._columns_min // 2:
                self.sync_requests()  # too small to pay for joining and writing back
                seg = 0
            else:
                # The segment's first ``fit`` requests are scheduled as the general loop would (blocks within the
                # free ones, tokens within the budget); the rest is written back and left to the loop.
                fit, need, context, min_remaining = cols.scan(free, limit, touch_one)
                if fit < seg and fit < limit and now is not None:
                    fit, need, context, min_remaining = self._preempt_for_columns(
                        out, now, (fit, need, context, min_remaining), limit, touch_one)
                    seg = len(cols)
                    free = self.pool.num_free
                if fit < seg:
                    cols.truncate(fit)
                    seg = fit
        growing: list[Request] = []
        # (``count``, ``joinable`` and ``budget`` as ``i64`` too: as Python ints, ``count >= limit`` and ``count += 1``
        # were a tag test and a checked add per request per step.)
        count: i64 = seg
        budget: i64 = limit
        joinable: i64 = 0  # steady decodes right after the segment, in a row, that may join it
        hashed = self.blocks_hashed
        # Tokens past ``computed`` that allocate_slots may hash: the one this step computes, or none under async
        # scheduling, where it is the previous step's sampled token, not appended yet (V1Scheduler._known_tokens:
        # a leading steady decode ran in the previous step; the block is hashed at the next schedule()).
        known = 0 if self.async_scheduling else 1
        to_hash = []
        # FCFS, blocks counted (not hashed), no decode columns, no finished request holding blocks: a request whose
        # block does not fit preempts from the back here, as the general loop would (below).
        preempts = (now is not None and not hashed and cols is None and not self.deferred_free
                    and not self.waiting.priority)
        # (A for loop over the list, not ``running[count]``: the compiled engine then reads each item without the
        # bounds-checked call per request per step; it reads the list's length at each item, as Python's iterator
        # does, so a preemption's ``running.pop()`` below ends it as the ``count < len(running)`` test did.  The
        # segment's requests are skipped by a slice: with decode columns nothing pops during the loop.)
        for req in running if not seg else running[seg:]:
            if count >= budget:
                break
            computed: i64 = req.num_computed_tokens
            prompt: i64 = req.prompt_tokens
            if prompt + req.num_output_tokens - computed != 1 or computed < prompt or computed < req.high_water:
                break
            # Blocks its next token needs: ``(computed + block_size) // block_size``, which is the blocks it holds
            # unless the token opens a block (or it holds more than its tokens need); the division only then.
            blocks: i64 = req.blocks
            edge: i64 = blocks * block_size
            if computed >= edge or computed + block_size < edge:
                blocks = (computed + block_size) // block_size
            grow: i64 = blocks - req.blocks
            if touch_one and req.appended_tokens != computed:
                break  # (its block table has seen every token but the last: then it touches one block)
            if need >= free if touch_one else need + grow > free:
                if not preempts or now is None:
                    break
                # The general loop (V1Scheduler.schedule, vLLM 0.33.0 v1/core/sched/scheduler.py; V0's
                # _schedule_running, 0.8.5 core/scheduler.py) has allocated the blocks of the requests before this
                # one; it now preempts the last running request until this one's block fits (V0: a free block is
                # left), or until it is the last and preempts itself (then it stops).  Fast path: done here, so that
                # the steady decodes after it stay on this path (a preemption sent the rest of the batch to the
                # general loop: ~13% of the reasoning case's decodes, each several times dearer).
                self.pool.allocate(need)
                need = 0
                fits = 1 if touch_one else grow
                while fits > self.pool.num_free:
                    victim = running.pop()
                    self._preempt_running(out, victim, now)
                    if victim is req:
                        break
                if count == len(running):  # it preempted itself: nothing after it is scheduled
                    break
                free = self.pool.num_free
            if grow:
                if grow < 0:
                    break  # holds more blocks than its tokens need: left to the general loop
                need += grow
                growing.append(req)  # (its blocks, ``(computed + block_size) // block_size``, are set below)
            if cols is not None and joinable == count - seg:
                # Joins in a state the columns derive everything from (see sim/engine/decode_columns.py).
                if (-(-computed // block_size) == req.blocks and req.stalled_since != req.stalled_since
                        and (not hashed or len(req.block_ids) == computed // block_size)):
                    joinable += 1
            context += computed + 1
            remaining: i64 = req.max_output - req.num_output_tokens
            if remaining < min_remaining:
                min_remaining = remaining
            if hashed and (computed + known) // block_size > len(req.block_ids):
                to_hash.append((count, req))  # this step's token fills a block: hashed below
            if req.decode_entry is None:
                # Its ``(request, 1)`` entry of ``out.scheduled`` (read below), made at its first fast-path step and
                # kept on the request (``Request.decode_entry``, dropped when it ends) instead of a new pair per
                # request per step, freed with the step's output (~15% of a cold incident run, callgrind).  Made here,
                # where the loop holds the request; the entries list below reads it without a check or a call.
                req.decode_entry = (req, 1)
            count += 1
        if not count or (whole and count < len(running)):
            return 0
        assert not out.scheduled, "the decode fast path schedules the step's first entries"
        self.pool.allocate(need)
        # A growing request's blocks were recomputed above from its computed tokens, which nothing has changed
        # since: computed again here rather than kept in a (request, blocks) pair per growing request per step.
        for req in growing:
            req.blocks = (req.num_computed_tokens + block_size) // block_size
        if joinable and cols is not None and joinable >= (DECODE_COLUMNS_JOIN if len(cols) else self._columns_min):
            cols.join(running[seg:seg + joinable])
            seg += joinable
        if hashed:
            # allocate_slots hashes a block as soon as this step's token fills it (0.33.0 kv_cache_manager.py).
            prefix_pool = self._prefix_pool()
            if seg:
                # A segment request at c computed holds c // B hashed blocks: the token fills one when
                # (c + 1) % B == 0.
                col_computed = cols.computed
                if known:
                    for i in cols.filling().tolist():
                        prefix_pool.cache_blocks(cols.requests[i], int(col_computed[i]) + 1)
                else:
                    # Async: the block the previous step filled (c % B == 0), hashed one step late.
                    for i in np.flatnonzero(col_computed[:seg] % block_size == 0).tolist():
                        prefix_pool.cache_blocks(cols.requests[i], int(col_computed[i]))
            for position, req in to_hash:
                if position >= seg:  # (the segment's were hashed above, joiners included)
                    prefix_pool.cache_blocks(req, req.num_computed_tokens + known)
        out.bulk_decode = count  # update_from_output counts these tokens as processed
        out.columnar = seg
        # (Any: mypyc keeps each tuple as it is.)
        if seg:
            # The segment's entries are kept by the columns (the same ``(request, 1)`` pairs, step after step).
            out.scheduled = cols.entries[:seg]
            if count > seg:
                more: list[Any] = [r.decode_entry for r in running[seg:count]]
                out.scheduled += more
        else:
            entries: list[Any] = [r.decode_entry for r in (running if count == len(running) else running[:count])]
            out.scheduled = entries
        out.decode_tokens += count
        shape = out.shape
        shape.num_seqs += count
        shape.num_decode += count
        shape.decode_context += context
        if count == len(running):
            out.min_remaining_outputs = min_remaining
        return count

    def _preempt_for_columns(self, out: SchedulerOutput, now: float, scan: tuple[int, int, int, int],
                             limit: int, touch_one: bool = False) -> tuple[int, int, int, int]:
        """The general running loop (V1: 0.33.0 v1/core/sched/scheduler.py; V0: 0.8.5 core/scheduler.py
        ``_schedule_running``) reaching segment request ``scan[0]`` (the first whose block
        :meth:`DecodeColumns.scan` found not to fit): it preempts the last running request
        (:meth:`_preempt_running`) until the block fits.  Done here on the columns: a victim in the segment (once
        the tail of objects is gone) is written back and dropped alone, and the segment is scanned again with the
        freed blocks, until it fits up to ``limit`` or the request itself was the last and was preempted (the
        general loop then stops, with nothing left after it).  Returns the new scan."""
        cols = self._columns
        assert cols is not None  # called by the columns' scan only
        running = self.running
        fit = scan[0]
        while fit < len(cols) and fit < limit:
            deferred = self._deferred_victim() if self.deferred_free else None
            if deferred is not None:
                self._preempt_deferred(out, deferred)
                scan = cols.scan(self.pool.num_free, limit, touch_one)
                fit = scan[0]
                continue
            last = len(cols) - 1
            if len(running) == len(cols):  # the victim is the segment's last request (perhaps request fit)
                cols.sync([last])
                cols.drop([last])
            victim = running.pop()
            self._preempt_running(out, victim, now)
            scan = cols.scan(self.pool.num_free, limit, touch_one)
            fit = scan[0]
        return scan

    def _preempt_running(self, out: SchedulerOutput, victim: Request, now: float) -> None:
        """Preempt a running request that the running loop picked as its victim (V1: by recompute)."""
        self._preempt_recompute(out, victim, now)

    # ---- decode columns (see sim/engine/decode_columns.py) ----------------------------------------------
    def use_decode_columns(self, min_batch: int = DECODE_COLUMNS_MIN) -> None:
        """Keep the leading steady decodes of the running batch as arrays once at least ``min_batch`` of them
        run (a smaller segment is written back: below that a Python loop over the requests is cheaper).  Only
        for a run loop that reads requests solely through the scheduler (no observer: Request attributes of
        the segment are stale), and only where every step's reads are covered: not under the priority
        policy (it may preempt any running request), nor for V0 with chunked prefill (it reorders running
        every step).  CPU-offload write-through stores the segment's full blocks from the columns
        (:meth:`_store_segment_blocks`)."""
        if self.waiting.priority or not self.supports_decode_columns:
            return
        self._columns = DecodeColumns(self.block_size)
        self._columns_min = max(2, int(min_batch))

    def stop_decode_columns(self) -> None:
        """Back to Request objects only (something else reads running requests now: an observer)."""
        self.sync_requests()
        self._columns = None

    def sync_requests(self) -> None:
        """Write the decode columns back to their requests and empty them (between steps): the sync point for
        anything outside the engine that reads a running request's state between steps (until then, the
        attributes ``decode_columns.STALE_ATTRIBUTES`` of the segment's requests hold ``STALE_INT`` /
        ``STALE_FLOAT``; see sim/engine/decode_columns.py).  The segment joins again at a later step."""
        cols = self._columns
        if cols is not None and len(cols):
            cols.sync()
            cols.drop(None)

    def token_marks(self, req: Request) -> tuple[float, float]:
        """``(last_token_s, max_itl_s)`` of ``req`` between steps, from the decode columns if it is in them."""
        cols = self._columns
        marks = cols.token_marks(req) if cols is not None else None
        return marks if marks is not None else (req.last_token_s, req.max_itl_s)

    def run_block_limit(self, free: int, limit: int) -> int:
        """Steps of a decode run of the whole running batch (at most ``limit``) before its new blocks exceed
        ``free`` (:func:`block_limit`); with decode columns, one compiled pass over them and the requests after."""
        cols = self._columns
        seg = len(cols) if cols is not None else 0
        rest = self.running[seg:] if seg else self.running
        if seg:
            tokens = np.fromiter((r.num_tokens for r in rest), dtype=np.int64, count=len(rest))
            return cols.run_block_limit(tokens, free, limit)
        # block_limit's residue counts, straight from the requests (no list of token counts made per run): a
        # request of ``t`` tokens first needs a block at residue ``(1 - t) % B`` (block_limit's ``(-t % B + 1) % B``
        # with one remainder, not two); with ``B`` a power of two, as vLLM's block sizes are, the remainder is a mask
        # (the same value for negative ``1 - t``, two's complement), since the compiled engine's i64 ``%`` is a call.
        block_size: i64 = self.block_size
        mask = self._block_mask
        num: i64 = len(rest)
        if block_size <= 16 and num < 32768:
            # Fast path (vLLM's block size 16 and below): the counts as 16-bit fields of four machine integers,
            # residue ``x``'s in word ``x >> 2`` at bit ``16 * (x & 3)`` (no list item read, boxed and stored per
            # request per bounded run; below 2**15 each, so no field carries into the next or the sign bit), then
            # the same list of counts as below.  test_run_block_limit.py ties both paths (sizes 1-40) to
            # block_limit.
            w0: i64 = 0
            w1: i64 = 0
            w2: i64 = 0
            w3: i64 = 0
            for r in rest:
                x: i64 = 1 - r.prompt_tokens - r.num_output_tokens
                x = x & mask if mask >= 0 else x % block_size
                # (Not ``1 << 16 * (x & 3)``: the compiled engine shifts the literal 1 as a 32-bit C int, 1 << 48 being
                # 1 << 16 there, even through an ``i64`` local, which it folds to the literal.)
                low: i64 = x & 3
                bit: i64 = 1 if low == 0 else 0x10000 if low == 1 else 0x100000000 if low == 2 else 0x1000000000000
                word: i64 = x >> 2
                if word == 0:
                    w0 += bit
                elif word == 1:
                    w1 += bit
                elif word == 2:
                    w2 += bit
                else:
                    w3 += bit
            packed = [0] * block_size
            for i in range(block_size):
                word_i: i64 = i >> 2
                w: i64 = w0 if word_i == 0 else w1 if word_i == 1 else w2 if word_i == 2 else w3
                packed[i] = int((w >> ((i & 3) << 4)) & 0xFFFF)
            return periodic_block_limit(packed, len(rest), int(block_size), free, limit)
        per_residue = [0] * block_size
        for r in rest:
            residue: i64 = 1 - r.prompt_tokens - r.num_output_tokens
            residue = residue & mask if mask >= 0 else residue % block_size
            # (Not ``+= 1``: on a list item the compiled engine adds through the interpreter's PyNumber_InPlaceAdd,
            # ~100 instructions per request per bounded run, 2% of a cold reasoning run, callgrind.)
            per_residue[residue] = per_residue[residue] + 1
        return periodic_block_limit(per_residue, len(rest), int(block_size), free, limit)

    def min_remaining_outputs(self) -> int:
        """Fewest outputs any running request still has to produce."""
        cols = self._columns
        seg = len(cols) if cols is not None else 0
        best = int((cols.final - cols.computed).min()) if seg else 1 << 62
        for r in self.running[seg:]:
            if r.max_output - r.num_output_tokens < best:
                best = r.max_output - r.num_output_tokens
        return best

    def _predicted_fits(self, req: Request, free: int) -> bool:
        """kvtune's predicted-memory admission: prompt + predicted remaining output must leave headroom."""
        predicted = self.predicted_output.get(req.class_name, req.max_output)
        remaining = max(1, min(predicted, req.max_output) - req.num_output_tokens)
        need = self.blocks_for(req.num_tokens + remaining)
        return free - need >= self.headroom_blocks


def remove_same(items: list[Request], req: Request) -> None:
    """``items.remove(req)``: the first item that is ``req`` taken out (``Request`` defines no ``__eq__``, so the first
    equal item is ``req`` itself).  list.remove compared every item before it through ``PyObject_RichCompare``
    (the default comparison's reflected tries, ~50 instructions an item: ~6 M of a cold reasoning run's 2,000
    finishes, callgrind); this compares pointers."""
    i: i64 = 0
    for item in items:
        if item is req:
            del items[i]
            return
        i += 1
    raise ValueError("list.remove(x): x not in list")


def block_limit(tokens: list[int], block_size: int, free: int, limit: int) -> int:
    """Steps of a decode run (at most ``limit``) before the running requests' block demand exceeds ``free``
    (``tokens``: their token counts at the run's first step).  Steps j >= 1 need a new block where
    ``(tokens + j - 1) % block_size == 0``: first at ``(-tokens) % block_size + 1``, then every ``block_size``
    steps.  (With decode columns :meth:`BaseScheduler.run_block_limit` asks the compiled
    ``_column_kernels.run_block_limit`` instead: the same count in one pass.)

    Fast path (the slow one summed the demand step by step, up to ``limit`` steps, with numpy: ~4,000-element
    arrays per run): the demand is periodic, each ``block_size`` steps every request crosses once, so after
    ``j = q * block_size + r`` steps it is ``q * len(tokens) + S[r]`` (``S``: the first ``r`` steps' crossings),
    and the first step whose demand exceeds ``free`` is found in whole periods, then within one period."""
    per_residue = [0] * block_size
    for t in tokens:
        per_residue[((-t) % block_size + 1) % block_size] += 1
    return periodic_block_limit(per_residue, len(tokens), block_size, free, limit)


def periodic_block_limit(per_residue: list[int], num: int, block_size: int, free: int, limit: int) -> int:
    """:func:`block_limit` of ``num`` requests given how many first need a new block at each step residue
    ``r`` (``per_residue[r % block_size]``: steps ``r``, ``r + block_size``, ...)."""
    if free < 0 or num == 0:
        # Every step needs >= 0 blocks: the first exceeds a negative ``free``; with no request none ever does.
        first = 1 if free < 0 else limit
        return first if first < limit else limit
    periods = free // num  # whole periods whose demand stays within ``free``
    left = free - periods * num
    step = periods * block_size
    demand = 0
    for r in range(1, block_size + 1):
        demand += per_residue[r % block_size]
        if demand > left:  # (the period's whole demand, ``num``, exceeds ``left``)
            step += r
            break
    return step if step < limit else limit
