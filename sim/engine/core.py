"""The engine core: one step = ``schedule()``, the latency model, ``update_from_output()``.

It also batches runs of identical decode steps: when a step is pure decode of every running request and
nothing can be admitted until a request finishes, the next steps differ only in context length until a
request finishes, a block boundary exhausts the free blocks, or the clock reaches the next arrival or client
deadline.  Those steps are bounded and summed at once (in closed form when the latency model says step times
are affine along the run, with numpy otherwise), so simulation work grows with events, not tokens.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Final

import numpy as np

from sim.engine.config import EngineConfig
from sim.engine.request import Request
from sim.engine.scheduler_base import BaseScheduler
from sim.engine.scheduler_output import SchedulerOutput
from sim.engine.scheduler_v0 import V0Scheduler
from sim.engine.scheduler_v1 import V1Scheduler
from sim.latency import PART_NAMES, LatencyModel, StepParts

#: Most decode steps batched in one computation (bounds the numpy arrays).
MAX_RUN_STEPS: Final = 4096  # (Final: a C static, see prefix_pool._NO_IDS)
#: Step rows buffered before they are handed to ``on_rows`` (when the step table is not kept).
ROWS_CHUNK = 65536

STEP_COLUMNS = (
    "step", "num_steps", "start_s", "duration_s", "num_running", "num_waiting", "num_swapped",
    "prefill_tokens_new", "prefill_tokens_recompute", "decode_tokens", "kv_blocks_used", "kv_blocks_total",
    "swap_out_blocks", "swap_in_blocks", "preempted",
) + tuple(f"time_{name}_s" for name in PART_NAMES)


class StepResult:
    """What a step did: its duration and how many identical iterations it stands for.

    A plain class with its own ``__init__``, not a dataclass: one is made per step, and a compiled dataclass keeps
    the ``__init__`` the dataclasses module generates, run by the interpreter (~2% of a cold incident or reasoning
    run, perf; see :class:`~sim.latency.StepShape`)."""

    __slots__ = ("output", "duration_s", "num_steps", "first_s", "last_s")

    def __init__(self, output: SchedulerOutput, duration_s: float, num_steps: int, first_s: float = 0.0,
                 last_s: float = 0.0) -> None:
        self.output = output
        self.duration_s = duration_s
        self.num_steps = num_steps
        #: Durations of a run's first and last steps (single step: both 0, unused).
        self.first_s = first_s
        self.last_s = last_s

    def __repr__(self) -> str:
        return (f"StepResult(duration_s={self.duration_s!r}, num_steps={self.num_steps!r}, first_s={self.first_s!r}, "
                f"last_s={self.last_s!r})")


def make_scheduler(
    config: EngineConfig, num_gpu_blocks: int, num_cpu_blocks: int, predicted_output: dict[str, int] | None = None
) -> BaseScheduler:
    usable = num_gpu_blocks - 1 if config.is_v1 else num_gpu_blocks  # V1 block 0 is the null block
    cls = V1Scheduler if config.is_v1 else V0Scheduler
    return cls(config, usable, num_cpu_blocks, predicted_output)


class EngineCore:
    """Steps a scheduler under a latency model and records the step table."""

    def __init__(
        self,
        scheduler: BaseScheduler,
        latency: LatencyModel,
        record_steps: bool = True,
        batch_decode_runs: bool = True,
        observer: Callable[[int, float, SchedulerOutput], None] | None = None,
        on_rows: Callable[[list[tuple]], None] | None = None,
    ):
        self.scheduler = scheduler
        self.latency = latency
        #: Keep every step row in ``step_rows``.  When off, rows are still made if ``on_rows`` is given, which
        #: receives them in chunks of ``ROWS_CHUNK`` (and the rest from :meth:`flush_rows`) and they are dropped.
        self.record_steps = record_steps
        self.on_rows = on_rows
        #: Off for step-by-step comparisons (conformance), where every iteration must be visible.
        self.batch_decode_runs = batch_decode_runs
        #: Called after every ``schedule()`` with (iteration index, time, output), before the output is applied.
        self.observer = observer
        #: Called with the output of every ``schedule()`` call, right after it (the decode columns stay on, their
        #: requests written back for the call): instrumentation (conformance, tests) that would otherwise wrap the
        #: scheduler's methods, which the compiled engine (sim/_compiled.py) calls directly.
        self.schedule_hook: Callable[[SchedulerOutput], None] | None = None
        #: Called with the iteration count after every :meth:`end_step` (between steps; the decode columns stay
        #: on, their requests written back for the call): instrumentation (tests) that reads requests' state.
        self.step_hook: Callable[[int], None] | None = None
        #: Async scheduling: the run loop's client aborts, called with the time right after each ``schedule()``
        #: and before the previous step's output is applied (vLLM 0.33 v1/engine/core.py step_with_batch_queue
        #: calls ``_process_aborts_queue()`` just before ``update_from_output``, while schedule(N+1) has already
        #: run): a request whose deadline came is still in that schedule's batch.  Returns the requests aborted.
        self.abort_due: Callable[[float], list[Request]] | None = None
        self.step_rows: list[tuple] = []
        self.num_iterations = 0
        self._pending: StepResult | None = None
        self.last_step_end = 0.0
        self._pending_start = 0.0
        #: The pending run's step times, for :meth:`cut_run`: ``(first, increment)`` when affine, else None and
        #: ``_run_durations`` holds them (one array per run the latency model computed; nothing is copied).
        self._run_affine: tuple[float, float] | None = None
        self._run_durations: np.ndarray | None = None

    def begin_step(self, now: float, next_event_s: float, next_deadline_s: float | None = None) -> StepResult | None:
        """Schedule a step (or a run of identical decode steps ending before ``next_event_s``).

        ``next_deadline_s``: the next event other than an arrival (a client deadline), when the caller knows it:
        a run then ends only before it if arrivals cannot change the run's decisions (the scheduler's
        :meth:`~BaseScheduler.arrivals_join_blocked_queue`: they queue behind a head that cannot be admitted
        until a request finishes).  Returns ``None`` when nothing can be scheduled.  The caller advances the
        clock by ``duration_s`` and then calls :meth:`end_step`.
        """
        scheduler = self.scheduler
        if self.observer is not None and scheduler._columns is not None:
            scheduler.stop_decode_columns()  # an observer may read any running request's state
        out = scheduler.schedule(now)
        if self.schedule_hook is not None:
            self._call_schedule_hook(out)
        # Async scheduling (vLLM 0.33 v1/engine/core.py step_with_batch_queue): schedule(N+1) ran with the
        # requests finished by step N still holding their blocks and slots; the aborts come next (see
        # ``abort_due``), then update_from_output(N) frees them.  When that left nothing to run (or only
        # preempted: a request finished by step N was still running), vLLM's next schedule() follows at once,
        # no model run between (step_with_batch_queue: ``model_executed`` False).
        aborted: list[Request] | None = None
        if self.abort_due is not None:
            scheduler.columnar_in_flight = out.columnar
            aborted = self.abort_due(now)
            scheduler.columnar_in_flight = 0
        freed = scheduler.flush_deferred()
        in_batch = bool(aborted) and bool(out.scheduled)
        if in_batch:
            out.steady_decode = False  # (its batch changes after this step)
        if (freed or bool(aborted)) and not out.scheduled:
            in_batch = False
            out = scheduler.schedule(now)
            if self.schedule_hook is not None:
                self._call_schedule_hook(out)
        shape = out.shape
        # V1 offload stores run on their own stream, overlapped with compute (see BaseScheduler.write_through);
        # only loads are on the step's path.  V0 swaps block the step both ways.
        shape.swap_blocks = out.swap_in_blocks + (0 if scheduler.write_through else out.swap_out_blocks)
        if scheduler.load_time is not None:
            # Asynchronous loads (see BaseScheduler.load_time): off the step's path as well.
            shape.swap_blocks = 0
        shape.swap_copies = out.swap_copies if shape.swap_blocks else 0
        if self.observer is not None:
            self.observer(self.num_iterations, now, out)
        if not out.scheduled:
            if out.preempted or out.swap_out_blocks:
                # Everything was preempted: the step still took the swap time and counts as a step.
                result = StepResult(out, self.latency.step_time(out.shape), 1)
                self._pending, self._pending_start = result, now
                return result
            self._hand_back(out)  # (nothing to apply)
            return None
        if out.steady_decode and self.batch_decode_runs:
            if next_deadline_s is not None and self.scheduler.arrivals_join_blocked_queue():
                next_event_s = next_deadline_s
            result = self._decode_run(out, now, next_event_s)
        else:
            result = StepResult(out, self.latency.step_time(shape), 1)
        if in_batch:
            _drop_aborted(out, aborted)
        self._pending, self._pending_start = result, now
        return result

    def _call_schedule_hook(self, out: SchedulerOutput) -> None:
        """The hook sees every request's state as the object path has it after ``schedule()`` (the columns' first
        ``out.columnar`` requests are in the step just scheduled)."""
        hook = self.schedule_hook
        assert hook is not None
        self._call_written_back(hook, out, out.columnar)

    def end_step(self, now: float) -> None:
        """Apply the pending step's output at time ``now`` (its end)."""
        result = self._pending
        assert result is not None, "end_step without begin_step"
        self._pending = None
        out = result.output
        scheduler = self.scheduler
        k = result.num_steps
        self.num_iterations += k
        self.last_step_end = now
        first_end = self._pending_start + result.first_s
        if not self.record_steps and self.on_rows is None:
            scheduler.update_from_output(out, now, k, first_end, result.last_s)
            self._hand_back(out)
            self._flush_if_idle()
            if self.step_hook is not None:
                self._call_step_hook()
            return
        parts = self.latency.run_parts(out.shape, result.duration_s, k)
        pool = scheduler.pool
        # The row describes the step itself: queue lengths before finished requests leave, and the blocks in use
        # at its end (a run's last step included) before finished requests free theirs.
        running, waiting, swapped, used = len(scheduler.running), len(scheduler.waiting), scheduler.num_swapped(), pool.num_used
        per_new, per_rec, per_dec, overhead = _shares(out, parts, k)
        grown = scheduler.update_from_output(out, now, k, first_end, result.last_s, bool(out.scheduled), per_new,
                                             per_rec, per_dec, overhead)
        # (The parts one by one, in ``StepParts.as_tuple``'s order: ``*parts.as_tuple()`` made the compiled engine build
        # a list, extend it with that tuple, convert it to a tuple and then unbox and box all 20 values again.)
        self.step_rows.append((
            self.num_iterations - k, k, self._pending_start, result.duration_s, running, waiting, swapped,
            out.prefill_tokens_new, out.prefill_tokens_recompute, out.decode_tokens * k, used + grown, pool.num_blocks,
            out.swap_out_blocks, out.swap_in_blocks, len(out.preempted),
            parts.prefill_new_s, parts.recompute_s, parts.decode_s, parts.transfer_s, parts.overhead_s,
        ))
        self._hand_back(out)
        if not self.record_steps and len(self.step_rows) >= ROWS_CHUNK:
            self.flush_rows()
        self._flush_if_idle()
        if self.step_hook is not None:
            self._call_step_hook()

    def _hand_back(self, out: SchedulerOutput) -> None:
        """The applied output goes back to the scheduler, whose next ``schedule()`` reuses it
        (``BaseScheduler.recycle``), unless an observer or a schedule hook was given it: they may keep it."""
        if self.observer is None and self.schedule_hook is None:
            self.scheduler.recycle(out)

    def _call_step_hook(self) -> None:
        """The hook sees every request's state between steps."""
        hook = self.step_hook
        assert hook is not None
        self._call_written_back(hook, self.num_iterations, 0)

    def _call_written_back(self, hook: Callable[[Any], None], arg: Any, scheduled: int) -> None:
        """``hook(arg)`` with the decode columns' requests written back for it, and marked stale again after it
        (sim/engine/decode_columns.py: ``sync``, ``poison``)."""
        cols = self.scheduler._columns
        if cols is None or not len(cols):
            hook(arg)
            return
        cols.sync(None, scheduled)
        hook(arg)
        cols.poison()

    def cut_run(self, horizon_s: float) -> StepResult:
        """End the pending step (from :meth:`begin_step`, not yet ended) before ``horizon_s``, as if ``horizon_s``
        had been the next event when it began: a run of decode steps keeps the steps that start before it (at
        least the first); a single step is kept whole.  Returns the pending result, cut or not.

        A run's steps after its first depend on nothing but the latency model and the batch (that is why they are
        batched), so the cut run is the run :meth:`begin_step` would have made had it known of ``horizon_s``:
        the same number of steps, durations and totals (``_decode_run`` bounds a run at the event in the same
        way, the step count being the smaller of every bound).  A router that decides at arrival time uses it to
        end a replica's run at an arrival routed there, and only then (``sim.runner.EngineLoop.cut``)."""
        result = self._pending
        assert result is not None, "cut_run without begin_step"
        k = result.num_steps
        if k <= 1:
            return result
        now = self._pending_start
        affine = self._run_affine
        if affine is not None:
            limit = _affine_steps_before(affine[0], affine[1], horizon_s - now, k)
            if limit >= k:
                return result
            if limit <= 1:
                cut = StepResult(result.output, result.first_s, 1)
            else:
                total = limit * affine[0] + affine[1] * limit * (limit - 1) / 2
                cut = StepResult(result.output, total, limit, result.first_s, affine[0] + affine[1] * (limit - 1))
        else:
            durations = self._run_durations
            assert durations is not None
            starts = now + np.concatenate(([0.0], np.cumsum(durations[:-1])))
            limit = max(1, min(k, int(np.searchsorted(starts, horizon_s, side="left"))))
            if limit >= k:
                return result
            if limit <= 1:
                cut = StepResult(result.output, result.first_s, 1)
            else:
                cut = StepResult(result.output, float(durations[:limit].sum()), limit, result.first_s,
                                 float(durations[limit - 1]))
        self._pending = cut
        return cut

    def pending_step(self) -> tuple[StepResult | None, float]:
        """The step or run begun by :meth:`begin_step` and not yet ended (None when there is none), and its start."""
        return self._pending, self._pending_start

    def run_starts(self) -> tuple[tuple[float, float] | None, np.ndarray | None]:
        """The pending run's step times (see :meth:`cut_run`): ``(affine, None)`` or ``(None, durations)``."""
        return (self._run_affine, None) if self._run_affine is not None else (None, self._run_durations)

    def _flush_if_idle(self) -> None:
        """With nothing left to schedule, vLLM runs no further schedule() before update_from_output frees the
        requests that just finished (async scheduling): free them now, not at the next arrival."""
        if self.scheduler.deferred_free and not self.scheduler.has_unfinished():
            self.scheduler.flush_deferred()

    def flush_rows(self) -> None:
        """Hand the buffered step rows to ``on_rows`` and drop them (no-op while the step table is kept)."""
        if self.record_steps or self.on_rows is None or not self.step_rows:
            return
        rows, self.step_rows = self.step_rows, []
        self.on_rows(rows)

    # ------------------------------------------------------------------------------------------------
    def _decode_run(self, out: SchedulerOutput, now: float, next_event_s: float) -> StepResult:
        """How many identical decode steps, starting with ``out``, can run before anything changes."""
        scheduler = self.scheduler
        running = scheduler.running
        batch = len(running)
        block_size = scheduler.block_size
        # Steps until the first request finishes (this step included).
        k_finish = out.min_remaining_outputs or scheduler.min_remaining_outputs()
        limit = min(k_finish, MAX_RUN_STEPS)
        first = float(self.latency.step_time(out.shape))
        if limit <= 1:
            return StepResult(out, first, 1)
        if next_event_s < math.inf:
            # Step durations only grow along a run, so this many steps reach the event at most.
            reach = int((next_event_s - now) / first) + 1 if first > 0 else limit
            limit = max(1, min(limit, reach))
            if limit <= 1:
                return StepResult(out, first, 1)
        # Blocks that must stay free after every step of the run (V0 checks a free block per decode, see
        # V0Scheduler._append_touched): a run stops before a step that would leave fewer.
        free = scheduler.pool.num_free - scheduler.decode_run_free_reserve
        context = out.shape.decode_context  # sum of every running request's tokens at the first step
        # Each request crosses a block boundary at most every block_size steps: if even that many new blocks
        # fit, blocks cannot bound the run and the per-residue demand need not be computed.  (The blocks a run
        # grows by are allocated by update_from_output.)
        if batch * -(-(limit - 1) // block_size) > free:
            limit = scheduler.run_block_limit(free, limit)
        affine = self.latency.decode_run_affine(batch, context)
        self._run_affine = affine
        if affine is not None:
            limit = _affine_steps_before(affine[0], affine[1], next_event_s - now, limit)
            if limit <= 1:
                return StepResult(out, first, 1)
            total = limit * affine[0] + affine[1] * limit * (limit - 1) / 2
            last = affine[0] + affine[1] * (limit - 1)
        else:
            durations = self.latency.decode_run_times(batch, context, limit)
            self._run_durations = durations
            if next_event_s < math.inf:
                starts = now + np.concatenate(([0.0], np.cumsum(durations[:-1])))
                k_time = int(np.searchsorted(starts, next_event_s, side="left"))
                limit = max(1, min(limit, k_time))
            if limit <= 1:
                return StepResult(out, first, 1)
            total = float(durations[:limit].sum())
            last = float(durations[limit - 1])
        return StepResult(out, total, limit, first, last)


def _shares(out: SchedulerOutput, parts: StepParts, num_steps: int) -> tuple[float, float, float, float]:
    """Each scheduled request's share of the step's time parts, as ``update_from_output`` adds them to it:
    ``(per new-prefill token, per recompute token, per decode token, per request)``: a part is split by the
    requests' tokens of that kind (a run's decode part equally over its batch), the overhead equally over the
    scheduled requests.  Transfer is not attributed (the request table has each request's swapped blocks).  All
    zero when nothing is scheduled (nothing to attribute).

    A tuple of four floats, never None: the compiled engine returns it as four C doubles, not a tuple of boxed
    floats.  Each count is divided as ``float(n)``, which is what Python's float-by-int division converts it to
    (and the compiled engine then divides C doubles instead of calling ``PyNumber_TrueDivide``)."""
    num = len(out.scheduled)
    if not num:
        return 0.0, 0.0, 0.0, 0.0
    overhead = parts.overhead_s / float(num)
    if num_steps > 1:
        return 0.0, 0.0, parts.decode_s / float(num), overhead
    per_new = parts.prefill_new_s / float(out.prefill_tokens_new) if out.prefill_tokens_new else 0.0
    per_rec = parts.recompute_s / float(out.prefill_tokens_recompute) if out.prefill_tokens_recompute else 0.0
    per_dec = parts.decode_s / float(out.decode_tokens) if out.decode_tokens else 0.0
    return per_new, per_rec, per_dec, overhead


def _drop_aborted(out: SchedulerOutput, aborted: list[Request] | None) -> None:
    """Requests aborted after the ``schedule()`` that put them in ``out`` (async scheduling): the step runs with
    them (its time counts their tokens), but its output no longer applies to them (vLLM's update_from_output
    skips finished requests).  The decode columns dropped theirs already (``BaseScheduler.abort``)."""
    if not aborted:
        return
    gone = {id(req) for req in aborted}
    keep: list[tuple[Request, int]] = []
    splits: list[tuple[int, int, int]] = []  # (``out.splits`` pairs with the entries after the bulk ones)
    columnar, bulk = out.columnar, out.bulk_decode
    for i, (req, n) in enumerate(out.scheduled):
        if id(req) in gone:
            if i < columnar:
                out.columnar -= 1
            if i < bulk:
                out.bulk_decode -= 1
        else:
            keep.append((req, n))
            if bulk <= i < bulk + len(out.splits):
                splits.append(out.splits[i - bulk])
    out.scheduled = keep
    out.splits = splits


def _affine_steps_before(first: float, increment: float, horizon_s: float, limit: int) -> int:
    """Number of steps (at most ``limit``) of durations ``first + increment * j`` that start before
    ``horizon_s`` from now: the largest k with start(k - 1) < horizon, start(j) = j first + increment j(j-1)/2."""
    if horizon_s == math.inf:
        return limit

    def start(j: int) -> float:
        return j * first + increment * j * (j - 1) / 2

    if increment > 0:
        half = first - increment / 2
        k = int(math.ceil((-half + math.sqrt(half * half + 2 * increment * horizon_s)) / increment))
    else:
        k = int(math.ceil(horizon_s / first)) if first > 0 else limit
    k = max(1, min(k, limit))
    # Guard the closed form against rounding: step k-1 must start before the horizon, step k must not.
    while k > 1 and start(k - 1) >= horizon_s:
        k -= 1
    while k < limit and start(k) < horizon_s:
        k += 1
    return k


__all__ = ["EngineCore", "StepResult", "STEP_COLUMNS", "make_scheduler"]
