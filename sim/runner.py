"""The SimPy run loop: an arrival process feeds the engine process, which steps until every request ended.

Two generator processes and no global state: ``Simulation._arrivals`` adds each request at its arrival time and
wakes an idle engine; :meth:`EngineLoop.process` expires client deadlines at step boundaries, asks the core for a
step (or a run of identical decode steps that ends before the next arrival or deadline), and holds the clock for
its duration.  The per-engine pieces are shared with ``sim.fleet`` (N engines behind a router on one clock): the
requests (:class:`RequestStore`), the arrival times an engine may receive (:class:`Feed`) and the loop with its
per-engine state (:class:`EngineLoop`) are one copy for both.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.engine.config import EngineConfig
from sim.engine.build import EnginePlan, build_engine, resolve_engine
from sim.engine.core import EngineCore, StepResult
from sim.engine.decode_columns import worth_loading
from sim.engine.request import FINAL_STATUSES, Request, Status
from sim.engine.sizing import KVSizing
from sim.errors import ConfigError, EngineAborted
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from sim.tables import RequestLog, step_table
from sim.workload.workload import MOONCAKE_HASH_BLOCK_TOKENS, Workload  # noqa: F401 (512: importable from here too)

#: Statuses of a request a client deadline can still abort.
_LIVE = (Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.LOADING)


#: Requests whose workload columns are made into Python lists at a time, as they arrive (``Simulation._request``).
LIST_CHUNK = 65536


@dataclass
class SimResult:
    """The two tables (docs/design.md, 'Data contracts') and what the run needs to be explained."""

    requests: pd.DataFrame
    #: The step table; empty when the run did not keep it (``record_steps=False``).
    steps: pd.DataFrame
    config: EngineConfig
    sizing: KVSizing
    makespan_s: float
    wall_s: float
    num_iterations: int
    aborted: str | None = None
    info: dict = field(default_factory=dict)


@dataclass
class Progress:
    """Passed to the progress callback every ``progress_every_s`` of wall time."""

    sim_time_s: float
    requests_done: int
    requests_total: int
    wall_s: float


def predicted_output_lengths(workload: Workload, quantile: float) -> dict[str, int]:
    """Per class, the ``quantile`` of its output length: what kvtune's predicted admission assumes.

    Taken from the workload itself, standing in for the operator's history of that class.
    """
    df = workload.requests
    out = {}
    for name, group in df.groupby("class", sort=False):
        out[str(name)] = int(np.ceil(np.quantile(group["output_tokens"].to_numpy(), quantile)))
    return out


class RequestStore:
    """The workload's requests as a run makes them: the workload's columns as arrays, each request's prefix keys,
    the live state of requests that arrived and have not ended (made at arrival from the columns), and the request
    table's arrays (``log``).  One per run, shared by every engine of it (a fleet's replicas too); indexed by
    workload row.

    ``config`` is the resolved engine config (block size, prefix caching, ``max_model_len``); ``predicted_output``
    the predicted admission's per-class output length (``predicted_output_lengths``), or None."""

    def __init__(self, workload: Workload, config: EngineConfig, seed: int, hash_block_tokens: int,
                 predicted_output: dict[str, int] | None, keep_requests: bool) -> None:
        self.config = config
        self.hash_block_tokens = hash_block_tokens
        #: With False, a request's live state is dropped once it ended (its row is in ``log``'s arrays).
        self.keep_requests = keep_requests
        df = workload.requests
        self.timeout_at, self.cancel_at = workload.client_deadlines(seed)
        self.priorities = workload.priorities()
        self.predicted = predicted_output
        self.ids = df["request_id"].to_numpy()
        # One str object per class, not per request (a million requests' own copies took ~60 MB; issue 34).
        codes, names = pd.factorize(df["class"].astype(str))
        self.classes = np.asarray(names, dtype=object)[codes]
        self.arrivals_s = df["arrival_s"].to_numpy(dtype=float)
        self.prompts = df["prompt_tokens"].to_numpy(dtype=np.int64)
        self.outputs = df["output_tokens"].to_numpy(dtype=np.int64)
        #: All requests' prefix keys in one int64 array and where each request's start (None: not made).
        self.key_array: np.ndarray | None = None
        self.key_starts: list[int] = []
        #: Per request, the block hashes of its leading full prompt blocks (empty: it shares nothing).
        self.keys = self._prefix_keys(df, self.prompts)
        self.log = RequestLog(self.ids, self.classes, self.arrivals_s, self.prompts, self.outputs)
        #: The columns of requests ``[_lists_start, _lists_start + LIST_CHUNK)`` as Python lists (see request).
        self._lists: list[list] = []
        self._lists_start = -1
        #: Requests created (at arrival) and not yet ended, by index; with ``keep_requests`` every request.
        self.live: dict[int, Request] = {}
        #: With ``keep_requests``, every request's live state (made up front), in workload order; else empty.
        self.requests: list[Request] = self._all_requests() if keep_requests else []

    def __len__(self) -> int:
        return len(self.arrivals_s)

    def request(self, i: int) -> Request:
        """Request ``i``'s live state (made once; with ``keep_requests`` all are made up front)."""
        req = self.live.get(i)
        if req is None:
            # From Python lists (indexing the numpy columns element by element costs more than the request), a
            # chunk of requests at a time: arrivals come in index order, and the lists of all columns of a million
            # requests took ~120 MB of that case's peak.
            start = i - i % LIST_CHUNK
            if start != self._lists_start:
                self._lists = [c[start:start + LIST_CHUNK].tolist() for c in self._columns()]
                self._lists_start = start
            ids, classes, arrivals, prompts, outputs, priorities, timeout_at, cancel_at = self._lists
            j = i - start
            req = self.live[i] = self._new_request(
                i, ids[j], classes[j], arrivals[j], prompts[j], outputs[j], priorities[j], timeout_at[j],
                cancel_at[j], self.keys[i])
        return req

    def record(self, finished: list[Request]) -> None:
        """Ended requests: their rows go to the request table's arrays, their live state is dropped (unless
        ``keep_requests``), and ``finished`` is emptied."""
        self.log.record_all(finished)
        if not self.keep_requests:
            live = self.live
            for req in finished:
                live.pop(req.index, None)
        finished.clear()

    def _columns(self) -> tuple[np.ndarray, ...]:
        """The columns a request's live state is made from, in :meth:`_new_request`'s order."""
        return (self.ids, self.classes, self.arrivals_s, self.prompts, self.outputs, self.priorities,
                self.timeout_at, self.cancel_at)

    def _all_requests(self) -> list[Request]:
        """Every request's live state, made up front (``keep_requests``), from the columns as Python lists
        (indexing the numpy columns element by element, as :meth:`request` does, costs more than the request)."""
        reqs = [self._new_request(i, *row)
                for i, row in enumerate(zip(*(c.tolist() for c in self._columns()), self.keys))]
        self.live.update(enumerate(reqs))
        return reqs

    def _new_request(self, i: int, request_id: int, cls: str, arrival_s: float, prompt: int, output: int,
                     priority: int, timeout_at: float, cancel_at: float, keys: tuple[int, ...]) -> Request:
        predicted = self.predicted
        req = Request(
            index=i, request_id=request_id, class_name=cls, arrival_s=arrival_s, prompt_tokens=prompt,
            output_tokens_target=output, max_model_len=self.config.max_model_len, priority=priority,
            predicted_output=predicted.get(cls, 0) if predicted else 0, timeout_at=timeout_at, cancel_at=cancel_at,
            prefix_keys=keys,
        )
        if keys and self.key_array is not None:
            start = self.key_starts[i]
            req.prefix_array = self.key_array[start:start + len(keys)]
        return req

    def _prefix_keys(self, df: pd.DataFrame, prompts: np.ndarray) -> list[tuple[int, ...]]:
        """Per request, the block hashes of its leading full prompt blocks from the trace's ``hash_ids`` (each id
        names one ``hash_block_tokens`` block of the prompt and, chained, everything before it, as in Mooncake's
        traces): kvtune block ``i`` gets key ``hash_id * (H / block_size) + offset``, and hash ``2 * key`` (even:
        see :func:`~sim.engine.prefix_pool.block_hash`).  Requests without ids share nothing."""
        if "hash_ids" not in df.columns or not self.config.enable_prefix_caching:
            return [()] * len(df)
        block_size = self.config.block_size
        if self.hash_block_tokens // block_size < 1 or self.hash_block_tokens % block_size:
            raise ConfigError("block_size", f"{block_size} does not divide the trace's hash block of "
                                            f"{self.hash_block_tokens} tokens; shared prefixes cannot be mapped")
        column = df["hash_ids"].to_numpy()
        found = _prefix_hash_array(column, prompts, block_size, self.hash_block_tokens)
        if found is None:
            return _int64_keys(_prefix_hashes_loop(column, prompts, block_size, self.hash_block_tokens))
        # Each request's keys are also handed to it as a view of the one array (Request.prefix_array), so that the
        # prefix pool does not convert its tuple: that conversion was ~30% of the elements the prefix case turned
        # from lists into arrays (benchmarks/tools/compiled_profile.py --case prefix).
        self.key_array, ends = found
        self.key_starts = [0, *ends[:-1]]
        return _key_tuples(*found)


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
    ``EngineLoop.cut``), and the blocks in use grow by each step's new blocks (a request needs one where its
    token count crosses a block boundary)."""

    def __init__(self, start_s: float, num_steps: int, affine: tuple[float, float] | None,
                 durations: np.ndarray | None, waiting: int, running: int, used: int, cumulative: list[int],
                 batch: int) -> None:
        self.start_s = start_s
        #: Steps of the run (less when it was cut).
        self.num_steps = num_steps
        self.affine = affine
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

    def boundary_s(self, j: int) -> float:
        """When step ``j`` of the run starts."""
        if self.affine is not None:
            first, increment = self.affine
            return self.start_s + (j * first + increment * j * (j - 1) / 2)
        assert self.starts is not None
        return float(self.starts[j])

    def last_boundary(self, at_s: float) -> int:
        """The last step of the run (0 to ``num_steps - 1``) that starts at or before ``at_s``."""
        k = self.num_steps
        if self.affine is None:
            assert self.starts is not None
            return max(0, min(k - 1, int(np.searchsorted(self.starts[:k], at_s, side="right")) - 1))
        first = self.affine[0]
        j = min(k - 1, max(0, int((at_s - self.start_s) / first))) if first > 0 else k - 1
        while j > 0 and self.boundary_s(j) > at_s:
            j -= 1
        while j < k - 1 and self.boundary_s(j + 1) <= at_s:
            j += 1
        return j

    def metrics(self, j: int, block_size: int) -> tuple[int, int, int]:
        """(waiting, running, blocks in use) published at step ``j >= 1``'s boundary."""
        m = j - 1  # the steps after the first whose blocks are in use by then
        used = self.used + (m // block_size) * self.batch + self.cumulative[m % block_size]
        at = self.boundary_s(j)
        return self.waiting + sum(1 for t in self.adds if t <= at), self.running, used


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
    ``history`` is a deque, (time, waiting, running, blocks in use, run) at each boundary, ``run`` a
    :class:`RunRecord` for a run's inner boundaries or None."""

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
        self.history: deque | None = None
        self.run_record: RunRecord | None = None
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
        pending = core._pending
        assert pending is not None
        steps = pending.num_steps
        start = core._pending_start
        result = core.cut_run(now)
        # The run's end is known now (a later arrival cannot end it sooner): applied before the arrival is added,
        # as the single engine applies a step before the arrivals during it.
        self.pending_end = -1.0
        record = self.run_record
        if record is not None and result.num_steps < steps:
            record.num_steps = result.num_steps
        self.clock = start + result.duration_s
        core.end_step(self.clock)

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
                    # the aborts, skips finished requests (0.33.0 v1/core/sched/scheduler.py).
                    req.num_output_tokens -= 1
                    if req.num_output_tokens == 0:
                        req.first_token_s = math.nan
        return aborted

    def _begin(self, now: float, next_arrival_s: float) -> StepResult | None:
        """Ask the core for a step at ``now`` bounded by the next arrival, deadline and load landing (None:
        nothing to run; when the engine aborted, ``stopped`` is set and ``aborted`` says why)."""
        deadlines = self.deadlines
        deadline = deadlines[0][0] if deadlines else math.inf
        try:
            return self.core.begin_step(now, min(next_arrival_s, deadline, self.scheduler.next_load_ready_s()),
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
            core.end_step(self.pending_end)
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
                # What vLLM's stats would publish at this boundary: the state before this step is scheduled.
                self.run_record = None
                history.append((now, len(scheduler.waiting), len(scheduler.running), pool.num_used, None))
            step = None
            if scheduler.has_unfinished():
                step = self._begin(now, math.inf)
                if self.stopped:
                    break
            if step is None:
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
            core.end_step(clock)
        self.clock = clock
        return math.inf if self.stopped or not more else clock

    def metrics_at(self, at_s: float) -> tuple[int, int, int]:
        """(waiting, running, blocks in use) as published at the last boundary at or before ``at_s`` (needs
        ``history``; older entries are dropped, so ``at_s`` may not decrease from call to call)."""
        history = self.history
        assert history is not None
        while len(history) > 1 and history[1][0] <= at_s:
            history.popleft()
        t, waiting, running, used, run = history[0]
        if run is not None and run.num_steps > 1:
            j = run.last_boundary(at_s)
            if j >= 1:
                return run.metrics(j, self.scheduler.block_size)
        return waiting, running, used

    def _record_run(self, now: float, num_steps: int) -> None:
        """A run of ``num_steps`` decode steps began at ``now``: its inner boundaries for ``history``."""
        scheduler = self.scheduler
        running = scheduler.running
        cols = scheduler._columns
        seg = len(cols) if cols is not None else 0
        rest = np.fromiter((r.num_tokens for r in (running[seg:] if seg else running)), dtype=np.int64,
                           count=len(running) - seg)
        tokens = np.concatenate((cols.computed + 1, rest)) if seg else rest
        bs = scheduler.block_size
        per_residue = np.bincount(((-tokens) % bs + 1) % bs, minlength=bs)
        steps = per_residue[np.arange(1, bs) % bs]
        cumulative = [0, *np.cumsum(steps).tolist()]
        affine, durations = self.core.run_starts()
        record = RunRecord(now, num_steps, affine, durations, len(scheduler.waiting), len(running),
                           scheduler.pool.num_used, cumulative, len(running))
        self.run_record = record
        self.history.append((record.boundary_s(1), record.waiting, record.running, record.used, record))

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
        while feed.next < total or self.done + len(finished) < self.assigned:
            if len(finished) > 256:
                self.drain()
            if env.now < clock and feed.next < total and times[feed.next] <= clock:
                yield env.timeout(clock - env.now)
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
                # Idle (or stuck until an arrival or deadline frees something): sleep until the next event; an
                # arrival wakes it (``add``).
                if env.now < clock:
                    yield env.timeout(clock - env.now)
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
                clock = env.now
                continue
            clock = now + step.duration_s
            core.end_step(clock)
            if self.progress is not None:
                wall = time.perf_counter()
                if wall - last_report >= self.progress_every_s:
                    last_report = wall
                    self.progress(Progress(clock, self.done + len(finished), total, wall - wall0))


class Simulation:
    """One simulated run of a workload on one engine config."""

    def __init__(
        self,
        workload: Workload,
        config: EngineConfig | EnginePlan,
        model: ModelProfile,
        gpu: GpuProfile,
        latency: LatencyModel | None = None,
        coefficients: LatencyCoefficients | None = None,
        seed: int = 0,
        record_steps: bool = True,
        max_sim_time_s: float = math.inf,
        progress: Callable[[Progress], None] | None = None,
        progress_every_s: float = 2.0,
        batch_decode_runs: bool = True,
        observer: Callable | None = None,
        hash_block_tokens: int | None = None,
        keep_requests: bool = True,
        step_sink: Callable[[pd.DataFrame], None] | None = None,
        decode_columns: bool | None = None,
    ):
        """``config``: an EngineConfig, or an :class:`~sim.engine.build.EnginePlan` (from ``resolve_engine``, for
        ``model`` and ``gpu``: then it is not resolved again, and ``latency`` / ``coefficients`` are the plan's).
        ``record_steps=False`` keeps no step table; ``step_sink`` then receives it in chunks (DataFrames of
        up to ``sim.engine.core.ROWS_CHUNK`` rows) as the run goes, e.g. ``objectives.StepTotals().add``.
        ``keep_requests=False`` drops each request's live state once it ended (its row is in the request
        table's arrays), so memory grows with the requests in the system, not with the workload; with
        ``True`` (the default) ``self.requests`` holds every request's final state.
        ``decode_columns=False`` keeps the running batch as Request objects only (the slow path the decode
        columns are checked against; see sim/engine/decode_columns.py); ``True`` keeps the decode columns;
        ``None`` (the default) keeps them where they pay in this process (``decode_columns.worth_loading``: their
        kernels are loaded already, as in a study's warmed-up worker, or the run is long enough to pay loading
        them, or it loads numba anyway for the prefix pool or the CPU tier).  The tables are the same."""
        plan = plan_for(config, model, gpu, latency, coefficients)
        predicted = predicted_output_for(workload, plan.config)
        built = build_engine(
            plan, model, gpu, predicted_output=predicted,
            record_steps=record_steps, batch_decode_runs=batch_decode_runs, observer=observer,
        )
        self.config, self.sizing, self.latency, self.core = built.config, built.sizing, built.latency, built.core
        self.model = model
        self.gpu = gpu
        self.workload = workload
        self.seed = seed
        self.max_sim_time_s = max_sim_time_s
        self.progress = progress
        self.progress_every_s = progress_every_s
        # Prompt tokens per hash_ids entry: the workload's own (its trace option) unless given here.
        self.hash_block_tokens = workload.hash_block_tokens if hash_block_tokens is None else hash_block_tokens
        self.keep_requests = keep_requests
        if step_sink is not None and not record_steps:
            self.core.on_rows = lambda rows: step_sink(step_table(rows))
        self.store = RequestStore(workload, self.config, seed, self.hash_block_tokens,
                                  self.core.scheduler.predicted_output, keep_requests)
        self.log = self.store.log
        #: Requests created (at arrival) and not yet ended, by index (the store's).
        self._live = self.store.live
        self.requests: list[Request] = self.store.requests
        scheduler = self.core.scheduler
        if scheduler.pool.enable_caching and any(self.store.keys):
            scheduler.share_prefixes()
        if decode_columns is None:
            decode_columns = worth_loading(len(workload), scheduler.blocks_hashed or scheduler.write_through)
        if decode_columns:
            # Running requests' steady decodes may live as arrays (the core stops that under an observer).
            scheduler.use_decode_columns()
        self.feed = Feed(self.store.arrivals_s)
        self.env = simpy.Environment()
        self.end_s = 0.0

    def _arrivals(self, env: simpy.Environment, loop: EngineLoop):
        store = self.store
        feed = self.feed
        arrivals = feed.times
        for i in range(feed.total):
            delay = float(arrivals[i]) - env.now
            if delay > 0:
                yield env.timeout(delay)
            feed.next += 1
            loop.add(store.request(i), env.now)

    # ---- run -------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        env = self.env
        # Made here: the core, ``max_sim_time_s`` and ``progress`` may be set after construction.
        loop = EngineLoop(self.core, self.store, self.feed, self.max_sim_time_s)
        loop.progress = self.progress
        loop.progress_every_s = self.progress_every_s
        env.process(self._arrivals(env, loop))
        engine = env.process(loop.process(env))
        with FrozenHeap():
            env.run(until=engine)
        requests, makespan, self.end_s = finish_run([loop], self.store, env.now)
        return SimResult(
            requests=requests,
            steps=step_table(self.core.step_rows if self.core.record_steps else []),
            config=self.config,
            sizing=self.sizing,
            makespan_s=makespan,
            wall_s=time.perf_counter() - wall0,
            num_iterations=self.core.num_iterations,
            aborted=loop.aborted,
            info=run_info(self.sizing, self.model, self.gpu),
        )


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


def run_info(sizing: KVSizing, model: ModelProfile, gpu: GpuProfile) -> dict:
    """A run result's ``info``: the KV sizing and what ran."""
    return {
        "num_gpu_blocks": sizing.num_gpu_blocks,
        "num_cpu_blocks": sizing.num_cpu_blocks,
        "block_bytes": sizing.block_bytes,
        "model": model.name,
        "gpu": gpu.name,
    }


def plan_for(config: EngineConfig | EnginePlan, model: ModelProfile, gpu: GpuProfile,
             latency: LatencyModel | None = None, coefficients: LatencyCoefficients | None = None) -> EnginePlan:
    """``config`` resolved for ``model`` on ``gpu`` (``resolve_engine``), or ``config`` itself if it is a plan."""
    if isinstance(config, EnginePlan):
        if latency is not None or coefficients is not None:
            raise ValueError("Simulation: a plan has its latency model; give latency/coefficients to resolve_engine")
        return config
    return resolve_engine(config, model, gpu, latency=latency, coefficients=coefficients)


def predicted_output_for(workload: Workload, config: EngineConfig) -> dict[str, int] | None:
    """The predicted admission's per-class output lengths for a resolved ``config`` (None unless its admission
    policy is ``predicted``)."""
    if config.admission_policy != "predicted":
        return None
    return predicted_output_lengths(workload, config.admission_quantile)


class FrozenHeap:
    """``with FrozenHeap():`` the heap allocated before it is frozen (``gc.freeze``: the cyclic collector's passes
    skip it; what is allocated inside is still collected), and unfrozen at the end; inside a heap someone else froze
    it changes nothing.

    A simulation allocates millions of short-lived objects, so the collector runs often, and each of its full passes
    would also walk everything allocated before (the workload, pandas, the imports).  ``simulate`` freezes the
    heap for the set-up (the prefix hashes, the request table's arrays), and ``Simulation.run`` again for the run.
    In a fresh process (``taskset -c 1 python benchmarks/sim_speed.py --no-profile --repeats 3``): the reasoning
    case took 0.22 CPU s with nothing frozen and 0.17 with the run frozen; freezing the set-up too took incident from
    0.14 to 0.09 CPU s and prefix from 0.26 to 0.21, reasoning and v0-swap unchanged.  (Freezing the set-up and the
    run in one block, the set-up's objects left in the collected heap, cost reasoning 6% and v0-swap 10%.)"""

    def __init__(self) -> None:
        self.froze = False

    def __enter__(self) -> FrozenHeap:
        self.froze = gc.get_freeze_count() == 0
        if self.froze:
            gc.freeze()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.froze:
            gc.unfreeze()


def simulate(workload: Workload, config: EngineConfig | EnginePlan, model: ModelProfile, gpu: GpuProfile, **kwargs) -> SimResult:
    """Run one simulation; keyword arguments go to :class:`Simulation`.  Its set-up runs in a :class:`FrozenHeap`,
    and so does its run (``Simulation.run``)."""
    with FrozenHeap():
        sim = Simulation(workload, config, model, gpu, **kwargs)
    return sim.run()


def _prefix_hashes_loop(column: np.ndarray, prompts: np.ndarray, block_size: int,
                        hash_block_tokens: int) -> list[tuple[int, ...]]:
    """``Simulation._prefix_keys`` request by request (the reference for :func:`_prefix_hashes`)."""
    per_hash = hash_block_tokens // block_size
    keys: list[tuple[int, ...]] = []
    for ids, prompt in zip(column, prompts):
        if ids is None or len(ids) == 0:
            keys.append(())
            continue
        num_blocks = min(len(ids) * hash_block_tokens, int(prompt)) // block_size
        keys.append(tuple((int(ids[i // per_hash]) * per_hash + i % per_hash) << 1 for i in range(num_blocks)))
    return keys


def _int64_keys(keys: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``keys`` unchanged if they all fit int64 (the prefix pool's arrays), else every distinct key renamed to twice
    its rank among them (still even, still distinct: the pool only compares keys)."""
    flat = {key for row in keys for key in row}
    if not flat or (min(flat) >= -(1 << 63) and max(flat) < 1 << 63):
        return keys
    rank = {key: 2 * i for i, key in enumerate(sorted(flat))}
    return [tuple(rank[key] for key in row) for row in keys]


def _prefix_hash_array(column: np.ndarray, prompts: np.ndarray, block_size: int,
                       hash_block_tokens: int) -> tuple[np.ndarray, list[int]] | None:
    """:func:`_prefix_hashes_loop` in one numpy pass over all requests, as all requests' keys in one int64 array and
    where each request's end, or ``None`` where it might differ: ids that are not all int64 (floats, or ints beyond
    int64) or so large that the hashes could overflow int64."""
    per_hash = hash_block_tokens // block_size
    rows = [() if ids is None else ids for ids in column]
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    flat = np.array([i for ids in rows for i in ids])
    if not len(flat):
        return np.zeros(0, dtype=np.int64), [0] * len(rows)
    limit = (1 << 62) // per_hash - 1  # |id| <= limit: |2 * (id * per_hash + offset)| < 2**63
    if flat.dtype.kind != "i" or flat.min() < -limit or flat.max() > limit:
        return None
    num_blocks = np.where(lengths > 0, np.minimum(lengths * hash_block_tokens, prompts) // block_size, 0)
    ends = np.cumsum(num_blocks)
    block = np.arange(int(ends[-1])) - np.repeat(ends - num_blocks, num_blocks)  # i within its request
    first_id = np.repeat(np.cumsum(lengths) - lengths, num_blocks)  # where the request's ids start in flat
    hashes = (flat[first_id + block // per_hash] * per_hash + block % per_hash) << 1
    return hashes.astype(np.int64, copy=False), ends.tolist()


def _prefix_hashes(column: np.ndarray, prompts: np.ndarray, block_size: int,
                   hash_block_tokens: int) -> list[tuple[int, ...]] | None:
    """:func:`_prefix_hash_array` as one tuple per request (:func:`_prefix_hashes_loop`'s form)."""
    found = _prefix_hash_array(column, prompts, block_size, hash_block_tokens)
    return None if found is None else _key_tuples(*found)


def _key_tuples(hashes: np.ndarray, ends: list[int]) -> list[tuple[int, ...]]:
    flat = hashes.tolist()
    return [tuple(flat[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
