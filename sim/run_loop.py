"""One engine's SimPy run loop (:class:`EngineLoop`) and what it needs: the arrival times it may receive requests
at (:class:`Feed`), a run of identical decode steps as its published metrics see it (:class:`RunRecord`), the
progress callback's argument (:class:`Progress`) and the end of a run (:func:`finish_run`).  The single engine
(``sim.runner.Simulation``) and each replica of a fleet (``sim.fleet``) run this same loop over one
:class:`~sim.request_store.RequestStore`."""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.engine.core import EngineCore, StepResult
from sim.engine.request import FINAL_STATUSES, Request, Status
from sim.errors import EngineAborted
from sim.request_store import RequestStore


#: Statuses of a request a client deadline can still abort.
_LIVE = (Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.LOADING)


@dataclass
class Progress:
    """Passed to the progress callback every ``progress_every_s`` of wall time."""

    sim_time_s: float
    requests_done: int
    requests_total: int
    wall_s: float


class Feed:
    """The arrival times an engine may receive requests at, in order, and how many of them have arrived (``next``:
    the arrivals process advances it).  One engine's own (the single engine's: the workload's), or shared by the
    replicas of a fleet whose router decides at arrival time (any arrival may come to any of them)."""

    def __init__(self, times: np.ndarray | list[float]) -> None:
        #: A numpy array or a list of floats (indexed one at a time).
        self.times = times
        self.next = 0
        self.total = len(times)


class RunRecord:
    """A run of identical decode steps as an engine's published metrics see it (``EngineLoop.history``): what
    stepping one iteration at a time would have published at the run's inner boundaries (steps 1 to ``k - 1``;
    step 0's boundary and the run's end are published as they come).  Queue lengths are those after the run's
    first ``schedule()`` (a steady decode admits and preempts nothing, and no request finishes before the run's
    end) plus the requests added to the waiting queue during the run (arrivals that do not end it, see
    ``EngineLoop.cut``) from the boundary after the step that left them waiting, and the blocks in use grow by each
    step's new blocks (a request needs one where its token count crosses a block boundary)."""

    def __init__(self, start_s: float, num_steps: int, affine: tuple[float, float] | None,
                 durations: np.ndarray | None, waiting: int, running: int, used: int, cumulative: list[int],
                 batch: int) -> None:
        self.start_s = start_s
        #: Steps of the run (less when it was cut).
        self.num_steps = num_steps
        #: Whether step ``j`` starts at ``start_s + j * first + increment * j * (j - 1) / 2`` (``affine``'s two
        #: terms, kept as plain floats: read at every boundary a router asks for, unboxed); else at ``starts[j]``.
        self.affine = affine is not None
        self.first = affine[0] if affine is not None else 0.0
        self.increment = affine[1] if affine is not None else 0.0
        self.starts: np.ndarray | None = None
        if affine is None and durations is not None:
            self.starts = start_s + np.concatenate(([0.0], np.cumsum(durations[:num_steps])))
        self.waiting = waiting
        self.running = running
        self.used = used
        #: ``cumulative[r]``: new blocks of steps ``1..r`` (r < block size); each further block size of steps
        #: adds ``batch``.
        self.cumulative = cumulative
        self.batch = batch
        #: When each request added to the waiting queue during the run was added.
        self.adds: list[float] = []
        #: (:meth:`seek`) The step found at the last call, and when the step after it starts (``inf``: none).
        self.step = 0
        self.next_s = math.inf

    def boundary_s(self, j: int) -> float:
        """When step ``j`` of the run starts."""
        if self.affine:
            return self.start_s + (j * self.first + self.increment * j * (j - 1) / 2)
        assert self.starts is not None
        return float(self.starts[j])

    def last_boundary(self, at_s: float) -> int:
        """The last step of the run (0 to ``num_steps - 1``) that starts at or before ``at_s``."""
        k = self.num_steps
        if not self.affine:
            assert self.starts is not None
            return max(0, min(k - 1, int(np.searchsorted(self.starts[:k], at_s, side="right")) - 1))
        first = self.first
        j = min(k - 1, max(0, int((at_s - self.start_s) / first))) if first > 0 else k - 1
        while j > 0 and self.boundary_s(j) > at_s:
            j -= 1
        while j < k - 1 and self.boundary_s(j + 1) <= at_s:
            j += 1
        return j

    def seek(self, at_s: float) -> int:
        """:meth:`last_boundary` for an ``at_s`` that does not decrease from call to call (``EngineLoop.metrics_at``):
        an affine run's steps are walked on from the last call's (the same step: its start is the last at or before
        ``at_s``, the starts growing along the run), a few per call instead of a search.  Sets ``next_s``."""
        k = self.num_steps
        if not self.affine:
            j = self.last_boundary(at_s)
            nxt = self.boundary_s(j + 1) if j + 1 < k else math.inf
        else:
            j = min(self.step, k - 1)  # a cut may have shortened the run since
            nxt = math.inf
            while j + 1 < k:
                nxt = self.boundary_s(j + 1)
                if nxt > at_s:
                    break
                j += 1
                nxt = math.inf
        self.step = j
        self.next_s = nxt
        return j

    def metrics(self, j: int, block_size: int) -> tuple[int, int, int]:
        """(waiting, running, blocks in use) published at step ``j >= 1``'s boundary."""
        m = j - 1  # the steps after the first whose blocks are in use by then
        used = self.used + (m // block_size) * self.batch + self.cumulative[m % block_size]
        return self.waiting_at(j), self.running, used

    def waiting_at(self, j: int) -> int:
        """The waiting count published at step ``j >= 1``'s boundary (``j = num_steps``: the run's end): the
        requests the run's first ``schedule()`` left waiting, and those added during the run by the time step
        ``j - 1`` was scheduled, which that ``schedule()`` left waiting (see ``EngineLoop.advance``)."""
        at = self.boundary_s(j - 1)
        added = 0
        for t in self.adds:  # a few at most: an arrival that can join the batch cuts the run
            if t <= at:
                added += 1
        return self.waiting + added


class Published:
    """What an engine published at one step boundary (``EngineLoop.history``): the time, the waiting and running
    counts and the blocks in use, and ``run``, the :class:`RunRecord` whose inner boundaries follow (None: a single
    step).  A compiled class, so that reading one back (``EngineLoop.metrics_at``, at each arrival for each
    replica whose figures may have changed) takes its fields without boxing them."""

    def __init__(self, t: float, waiting: int, running: int, used: int, run: RunRecord | None) -> None:
        self.t = t
        self.waiting = waiting
        self.running = running
        self.used = used
        self.run = run


#: ``EngineLoop.history``'s entries before ``history_head`` are dropped once there are this many and they are at
#: least half of the list (the list is not shifted at every read).
HISTORY_TRIM = 4096


class EngineLoop:
    """One engine's SimPy process and its per-engine state: the single engine's (``Simulation``) and each
    replica's of a fleet (``sim.fleet``), the same loop.

    The engine keeps its own clock and hands control back to SimPy only when an arrival it may receive is due (or
    it must sleep): deadlines are the engine's own, so steps between two arrivals need no SimPy event.  At each
    step boundary it expires client deadlines, asks the core for a step (or a run of identical decode steps that
    ends before the next event) and holds the clock for its duration.

    ``feed``: the arrival times it may receive requests at; the arrivals process advances ``feed.next`` and calls
    :meth:`add` for each request that comes here.  ``own_feed`` False (a fleet whose router decides at each arrival
    which replica gets it): no SimPy process; the fleet calls :meth:`advance` up to each arrival, only for engines
    with a boundary, run end or wake-up before it, so an engine is not stopped by arrivals routed elsewhere; a run
    of decode steps is not bounded by them, and an arrival routed here ends it at that arrival (:meth:`cut`),
    exactly as a bound known in advance would have (``EngineCore.cut_run``).  ``store``: the run's requests (live
    state, request table).

    Published for a router (set by the fleet, package-internal): ``ended_pub`` (requests ended by the last
    boundary; with ``dirty`` the engine's ``index`` is appended to it when that count changes) and, when
    ``history`` is a list (:meth:`keep_history`), a :class:`Published` at each boundary from ``history_head`` on
    (the entries before it are read and may be dropped)."""

    def __init__(self, core: EngineCore, store: RequestStore, feed: Feed, max_sim_time_s: float = math.inf,
                 own_feed: bool = True, index: int = 0) -> None:
        self.core = core
        self.scheduler = core.scheduler
        self.store = store
        self.feed = feed
        self.own_feed = own_feed
        self.index = index
        self.max_sim_time_s = max_sim_time_s
        #: Requests added here, and those of them ended (recorded in ``store``) or in ``scheduler.finished``.
        self.assigned = 0
        self.done = 0
        self.deadlines: list[tuple[float, int]] = []
        #: Async scheduling: ``(last_token_s, max_itl_s)`` before the step that ends next, of the running requests
        #: whose client deadline comes by its end (:meth:`_mark_undelivered`): the token that step samples for them
        #: is not delivered, so :meth:`expire_deadlines` puts these back.
        self.undelivered: dict[int, tuple[float, float]] = {}
        self.wake: simpy.Event | None = None
        self.aborted: str | None = None
        self.progress: Callable[[Progress], None] | None = None
        self.progress_every_s = 2.0
        #: (``advance``) The engine's own clock: the boundary (or wake-up) it acts at next; the end of a pending run
        #: of decode steps that an arrival may still cut (else -1); whether it sleeps until an arrival (or
        #: ``clock``, a deadline) and whether it stopped for good (aborted, or past ``max_sim_time_s``).
        self.clock = 0.0
        self.pending_end = -1.0
        self.idle = False
        self.stopped = False
        self.ended_pub = 0
        self.dirty: list[int] | None = None
        self.history: list[Published] | None = None
        self.history_head = 0
        self.run_record: RunRecord | None = None
        #: The waiting count right after the engine last scheduled: what it publishes at the next boundary (see
        #: ``advance``).
        self.waiting_pub = 0
        if self.scheduler.async_scheduling:
            # vLLM 0.33's async engine core takes the aborts after schedule(N+1), before update_from_output(N)
            # (v1/engine/core.py step_with_batch_queue): the core calls this then, instead of the loop before.
            core.abort_due = self.expire_deadlines

    def add(self, req: Request, now: float) -> None:
        """A request that comes here arrives (after ``feed.next`` was advanced past it)."""
        self.assigned += 1
        scheduler = self.scheduler
        scheduler.add_request(req, now)
        if req.deadline < math.inf:
            heapq.heappush(self.deadlines, (req.deadline, req.index))
        record = self.run_record
        if record is not None and req.status == Status.WAITING:
            record.adds.append(now)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()
        if self.idle:
            self.idle = False
            self.clock = now  # woken by the arrival (``advance``)

    def cut(self, now: float) -> None:
        """An arrival at ``now`` comes here (``advance``'s engine): a run of decode steps still under way ends at the
        first step boundary at or after it (the engine's clock moves back to that boundary), as if the arrival had
        been known when the run began (``EngineCore.cut_run``).  Called before :meth:`add`; a no-op when no run is
        pending past ``now``."""
        if self.pending_end <= now:
            return
        core = self.core
        pending, start = core.pending_step()
        assert pending is not None
        steps = pending.num_steps
        result = core.cut_run(now)
        # The run's end is known now (a later arrival cannot end it sooner): applied before the arrival is added,
        # as the single engine applies a step before the arrivals during it.
        self.pending_end = -1.0
        record = self.run_record
        if record is not None and result.num_steps < steps:
            record.num_steps = result.num_steps
        self.clock = start + result.duration_s
        self._end_step(self.clock)

    def drain(self) -> None:
        """Ended requests to the request table."""
        finished = self.scheduler.finished
        if finished:
            self.done += len(finished)
            self.store.record(finished)

    def pending(self) -> bool:
        """Requests may still come, or some that came have not ended."""
        feed = self.feed
        return feed.next < feed.total or self.done + len(self.scheduler.finished) < self.assigned

    def next_event_s(self) -> float:
        """The next arrival (of the own feed), client deadline or load landing."""
        feed = self.feed
        nxt = float(feed.times[feed.next]) if self.own_feed and feed.next < feed.total else math.inf
        if self.deadlines and self.deadlines[0][0] < nxt:
            nxt = self.deadlines[0][0]
        # An asynchronous load from the CPU tier landing makes its request schedulable.
        return min(nxt, self.scheduler.next_load_ready_s())

    def expire_deadlines(self, now: float) -> list[Request]:
        """Abort every live request whose client deadline has come; returns them.  Called at each step boundary
        before ``schedule()``, or with async scheduling by the engine core right after it (``EngineCore.abort_due``)."""
        scheduler = self.scheduler
        live = self.store.live
        aborted: list[Request] = []
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, index = heapq.heappop(self.deadlines)
            req = live.get(index)
            if req is None:
                continue  # it ended already
            status = Status.TIMED_OUT if req.timeout_at <= req.cancel_at else Status.CANCELLED
            was_live = req.status in _LIVE
            scheduler.abort(req, status, deadline)
            if was_live:
                aborted.append(req)
                if scheduler.async_scheduling and req.last_token_s == now and req.num_output_tokens > 0:
                    # The token of the step that just ended is not delivered: vLLM's update_from_output, after
                    # the aborts, skips finished requests (0.33.0 v1/core/sched/scheduler.py).  Its time and
                    # gap go with it.
                    req.num_output_tokens -= 1
                    if req.num_output_tokens == 0:
                        req.first_token_s = math.nan
                    marks = self.undelivered.get(index)
                    if marks is not None:
                        req.last_token_s, req.max_itl_s = marks
        self.undelivered.clear()
        return aborted

    def _end_step(self, end_s: float) -> None:
        """Apply the pending step or run at its end (``EngineCore.end_step``); with async scheduling and a client
        deadline come by then, first keep what the abort right after it takes back (:meth:`_mark_undelivered`)."""
        core = self.core
        if core.abort_due is not None and self.deadlines and self.deadlines[0][0] <= end_s:
            self._mark_undelivered(end_s)
        core.end_step(end_s)

    def _mark_undelivered(self, end_s: float) -> None:
        """Async scheduling, before the step ending at ``end_s`` is applied: keep ``(last_token_s, max_itl_s)`` of
        the running requests whose deadline comes by then (``undelivered``), the step's token for them being
        taken back when they are aborted right after the next ``schedule()``.  Only when such a deadline exists."""
        deadlines = self.deadlines
        due: list[tuple[float, int]] = []
        while deadlines and deadlines[0][0] <= end_s:
            due.append(heapq.heappop(deadlines))
        live = self.store.live
        for entry in due:
            heapq.heappush(deadlines, entry)
            req = live.get(entry[1])
            if req is not None and req.status == Status.RUNNING:
                self.undelivered[entry[1]] = self._marks_before_last_step(req, end_s)

    def _marks_before_last_step(self, req: Request, end_s: float) -> tuple[float, float]:
        """``(last_token_s, max_itl_s)`` of a running request as they will be after the pending step or run ending
        at ``end_s`` less its last step, as ``BaseScheduler.update_from_output`` makes them: a run's gaps are the
        one to its first token, then its step times, which only grow (so its second-to-last step is the longest
        of those left)."""
        last, peak = self.scheduler.token_marks(req)
        core = self.core
        result, start = core.pending_step()
        if result is None or result.num_steps <= 1:
            return last, peak
        k = result.num_steps
        gap = start + result.first_s - last
        if not gap <= peak:
            peak = gap
        if k >= 3:
            affine, durations = core.run_starts()
            if affine is not None:
                gap = affine[0] + affine[1] * (k - 2)
            else:
                assert durations is not None
                gap = float(durations[k - 2])
            if not gap <= peak:
                peak = gap
        return end_s - result.last_s, peak

    def _take_passed_deadlines(self, now: float) -> bool:
        """With async scheduling the run loop takes client deadlines only right after a ``schedule()``
        (``EngineCore.abort_due``), so an engine with nothing to schedule never reached them: the next event was a
        deadline already passed (mostly the entry of a request that ended before it), and the loop waited for it at
        the same time for ever.  vLLM's engine core takes aborts from its input queue whether or not a step runs
        (0.33 v1/engine/core.py run_busy_loop: ``_process_input_queue`` before each step), so an idle engine takes
        them here.  True when one was taken (the caller looks again at ``now``)."""
        if self.deadlines and self.deadlines[0][0] <= now:
            self.expire_deadlines(now)
            return True
        return False

    def _begin(self, now: float, next_arrival_s: float) -> StepResult | None:
        """Ask the core for a step at ``now`` bounded by the next arrival, deadline and load landing (None:
        nothing to run; when the engine aborted, ``stopped`` is set and ``aborted`` says why)."""
        deadlines = self.deadlines
        deadline = deadlines[0][0] if deadlines else math.inf
        try:
            return self.core.begin_step(now, least(next_arrival_s, deadline, self.scheduler.next_load_ready_s()),
                                        deadline)
        except EngineAborted as exc:
            self.aborted = str(exc)
            self.stopped = True
            return None

    def advance(self, until_s: float) -> float:
        """Behind a router that decides at each arrival (``own_feed`` False; no SimPy process): run this engine up
        to the next fleet arrival, at ``until_s`` (every arrival before it routed; ``inf``: none is left).

        Each step that begins before ``until_s`` is taken (an arrival at a boundary joins the step that begins
        there, as ``cut_run`` and the single engine have it), and each boundary is published for the router
        (``ended_pub``, ``dirty``, ``history``).  A run of decode steps that ends after ``until_s`` is left pending
        (an arrival routed here cuts it, :meth:`cut`), its end applied at a later call once no arrival before it
        remains; arrivals routed elsewhere never stop the engine.  Returns when the engine next acts without an
        arrival coming here (the boundary or run end it stopped at, the deadline or load landing it sleeps until;
        ``inf``: it sleeps until an arrival, or it is done or stopped): the fleet calls it again once that time is
        at or before its next arrival, so only engines with something due are advanced."""
        if self.stopped:
            return math.inf
        core = self.core
        if self.pending_end >= 0.0:
            if self.pending_end > until_s:
                return self.pending_end
            self._end_step(self.pending_end)
            self.pending_end = -1.0
        scheduler = self.scheduler
        deadlines = self.deadlines
        finished = scheduler.finished
        dirty = self.dirty
        history = self.history
        pool = scheduler.pool
        more = until_s < math.inf  # arrivals may still come
        clock = self.clock
        self.idle = False
        while clock < until_s:
            if not (more or self.done + len(finished) < self.assigned):
                break
            if len(finished) > 256:
                self.drain()
            now = clock
            if now > self.max_sim_time_s:
                self.stopped = True
                break
            if deadlines and deadlines[0][0] <= now and core.abort_due is None:
                self.expire_deadlines(now)
                if not (more or self.done + len(finished) < self.assigned):
                    break  # the last requests ended by client deadline
            ended = self.done + len(finished)
            if ended != self.ended_pub:
                self.ended_pub = ended
                if dirty is not None:
                    dirty.append(self.index)
            if history is not None:
                # What vLLM's stats publish at this boundary: the requests running and the blocks in use now, and
                # the waiting count the last schedule() left.  vLLM 0.32/0.33 makes its SchedulerStats at the end
                # of update_from_output (v1/core/sched/scheduler.py make_stats); its engine core adds the requests
                # that came in during the step only after that, before the next schedule() (v1/engine/core.py
                # run_busy_loop: _process_input_queue).  So an arrival counts as waiting only once a schedule()
                # has left it waiting (``RunRecord.waiting_at`` inside a run of decode steps), and a woken idle
                # engine publishes the count of its last step.
                record = self.run_record
                if record is not None:  # the end of a run: what its last step's schedule() left
                    self.waiting_pub = record.waiting_at(record.num_steps)
                    self.run_record = None
                history.append(Published(now, self.waiting_pub, len(scheduler.running), pool.num_used, None))
            step = None
            if scheduler.has_unfinished():
                step = self._begin(now, math.inf)
                if history is not None:
                    self.waiting_pub = len(scheduler.waiting)
                if self.stopped:
                    break
            if step is None:
                if self._take_passed_deadlines(now):
                    continue
                # Idle (or stuck until an arrival or deadline frees something): asleep until the next event; an
                # arrival routed here wakes it (``add``).
                nxt = self.next_event_s()
                if nxt == math.inf and not more:
                    self.aborted = self.aborted or "no request can make progress"
                    self.stopped = True
                    break
                if nxt >= until_s:
                    self.clock, self.idle = nxt, True
                    return nxt
                clock = nxt
                continue
            clock = now + step.duration_s
            if history is not None and step.num_steps > 1:
                self._record_run(now, step.num_steps)
            if step.num_steps > 1 and until_s < clock and not scheduler.arrivals_join_blocked_queue():
                # An arrival may come here before the run ends: its end is applied once none can (or at the cut).
                self.pending_end = self.clock = clock
                return clock
            self._end_step(clock)
        self.clock = clock
        return math.inf if self.stopped or not more else clock

    def keep_history(self) -> None:
        """Publish each boundary in ``history`` from now on (for a router that reads engine metrics), starting from
        the idle engine's figures at time 0."""
        self.history = [Published(0.0, 0, 0, 0, None)]
        self.history_head = 0

    def metrics_at(self, at_s: float) -> tuple[int, int, int, float, float]:
        """(waiting, running, blocks in use) as published at the last boundary at or before ``at_s`` (needs
        ``history``; older entries are dropped, so ``at_s`` may not decrease from call to call), then two times
        after ``at_s`` (``inf``: none yet): the next ``history`` entry, and the next inner boundary of the run of
        decode steps ``at_s`` falls in (``inf`` outside a run).  Until the first of them, and until this engine is
        advanced again or a request is added here, the same figures are published; from the second to the first,
        the blocks in use can only grow (a run's steps free none: ``RunRecord``).  ``sim.fleet._loop.MetricViews``
        reads them so."""
        history = self.history
        assert history is not None
        head = self.history_head
        last = len(history) - 1
        while head < last and history[head + 1].t <= at_s:
            head += 1
        if head >= HISTORY_TRIM and 2 * head >= len(history):
            del history[:head]
            last -= head
            head = 0
        self.history_head = head
        published = history[head]
        waiting, running, used = published.waiting, published.running, published.used
        run = published.run
        entry = history[head + 1].t if head < last else math.inf
        inner = math.inf
        if run is not None and run.num_steps > 1:
            j = run.seek(at_s)
            inner = run.next_s
            if j >= 1:
                waiting, running, used = run.metrics(j, self.scheduler.block_size)
        return waiting, running, used, entry, inner

    def run_queued(self) -> bool:
        """Whether the figures :meth:`metrics_at` last returned fall in a run of decode steps that had requests
        queued during it (added here while it ran, ``RunRecord.adds``): its published waiting count then grows at
        the run's inner boundaries, where without them only the blocks in use do."""
        history = self.history
        assert history is not None
        run = history[self.history_head].run
        return run is not None and len(run.adds) > 0

    def _record_run(self, now: float, num_steps: int) -> None:
        """A run of ``num_steps`` decode steps began at ``now``: its inner boundaries for ``history``."""
        scheduler = self.scheduler
        running = scheduler.running
        cols = scheduler._columns
        seg = len(cols) if cols is not None else 0
        bs = scheduler.block_size
        # Requests by the step of the run (1 to bs, counted modulo bs) whose token crosses a block boundary: one
        # with t tokens (a column's computed tokens + 1) at the run's first step needs a new block at step
        # (1 - t) mod bs.  The columns counted in one numpy pass, the requests after them one by one.
        per_residue: list[int] = np.bincount((-cols.computed) % bs, minlength=bs).tolist() if seg else [0] * bs
        for r in running[seg:] if seg else running:
            per_residue[(1 - r.num_tokens) % bs] += 1
        cumulative = [0] * bs
        total = 0
        for m in range(1, bs):
            total += per_residue[m]
            cumulative[m] = total
        affine, durations = self.core.run_starts()
        record = RunRecord(now, num_steps, affine, durations, len(scheduler.waiting), len(running),
                           scheduler.pool.num_used, cumulative, len(running))
        self.run_record = record
        history = self.history
        assert history is not None
        history.append(Published(record.boundary_s(1), record.waiting, record.running, record.used, record))

    def process(self, env: simpy.Environment):
        """The engine's SimPy process: steps until every request that came (and may still come) ended."""
        core = self.core
        scheduler = self.scheduler
        feed = self.feed
        times = feed.times
        total = feed.total
        deadlines = self.deadlines
        finished = scheduler.finished
        inf = math.inf
        wall0 = time.perf_counter()
        last_report = wall0
        clock = env.now
        # ``env.now``, read again after each yield: the clock moves only while this process is suspended, and
        # ``env.now`` is a Python property (an attribute lookup and a call per read, twice per step compiled).  A
        # stale ``sim_now`` would make the next catch-up yield overshoot the engine's clock
        # (tests/sim/engine/test_run_clock.py).
        sim_now = clock
        while feed.next < total or self.done + len(finished) < self.assigned:
            if len(finished) > 256:
                self.drain()
            if sim_now < clock and feed.next < total and times[feed.next] <= clock:
                yield env.timeout(clock - sim_now)
                sim_now = env.now
            now = clock
            if now > self.max_sim_time_s:
                break
            if deadlines and deadlines[0][0] <= now and core.abort_due is None:
                self.expire_deadlines(now)
                if not (feed.next < total or self.done + len(finished) < self.assigned):
                    break  # the last requests ended by client deadline
            step = None
            if scheduler.has_unfinished():
                step = self._begin(now, float(times[feed.next]) if feed.next < total else inf)
                if self.stopped:
                    break
            if step is None:
                if self._take_passed_deadlines(now):
                    continue
                # Idle (or stuck until an arrival or deadline frees something): sleep until the next event; an
                # arrival wakes it (``add``).
                if sim_now < clock:
                    yield env.timeout(clock - sim_now)
                    sim_now = env.now
                nxt = self.next_event_s()
                if nxt == inf:
                    if feed.next >= total:
                        self.aborted = self.aborted or "no request can make progress"
                        break
                self.wake = env.event()
                if nxt < inf:
                    yield self.wake | env.timeout(nxt - now)
                else:
                    yield self.wake
                self.wake = None
                clock = sim_now = env.now
                continue
            clock = now + step.duration_s
            self._end_step(clock)
            if self.progress is not None:
                wall = time.perf_counter()
                if wall - last_report >= self.progress_every_s:
                    last_report = wall
                    self.progress(Progress(clock, self.done + len(finished), total, wall - wall0))


def least(a: float, b: float, c: float) -> float:
    """``min(a, b, c)`` (the first least value, as ``min`` takes it): the compiled engine calls ``min`` of three
    floats through the builtins module, with each float boxed; this compares C doubles."""
    if b < a:
        a = b
    if c < a:
        a = c
    return a


def finish_run(loops: list[EngineLoop], store: RequestStore, now: float,
               replica_of: np.ndarray | None = None) -> tuple[pd.DataFrame, float, float]:
    """End a run of ``loops`` (one engine, or a fleet's replicas) over ``store`` at clock ``now``: requests still
    running synced out of the decode columns, ended ones recorded, the rest marked unfinished (settled on the
    engine they came to: ``replica_of[index]``, or the first), each engine's step rows flushed.  Returns the request
    table, the makespan (first arrival to last end; to the run's end when no request ended) and the run's end (an
    engine may have run ahead of the clock)."""
    end_s = now
    for loop in loops:
        loop.scheduler.sync_requests()  # requests still running: their state out of the decode columns
        end_s = max(end_s, loop.core.last_step_end)
        loop.drain()
    unfinished = [req for req in store.live.values() if req.status not in FINAL_STATUSES]
    for req in unfinished:
        req.status = Status.UNFINISHED
        owner = 0 if replica_of is None else max(int(replica_of[req.index]), 0)
        loops[owner].scheduler.settle(req)
    store.log.record_all(unfinished)
    for loop in loops:
        loop.core.flush_rows()
    requests = store.log.table()
    end = requests["end_s"].max() if len(requests) else 0.0
    start = requests["arrival_s"].min() if len(requests) else 0.0
    makespan = float(end - start) if end == end else float(end_s - start)
    return requests, makespan, end_s
