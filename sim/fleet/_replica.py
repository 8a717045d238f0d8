"""One engine replica on the fleet's SimPy clock: the run loop of ``sim.runner.Simulation._engine`` for one of
several engines, and the metrics it publishes for the router.

The loop is ``Simulation._engine``'s, step for step (so that one replica reproduces ``simulate`` exactly; the
fleet tests compare the tables): the engine keeps its own clock and hands control back to SimPy only when an
arrival it may receive is due.  What differs: the arrivals it may receive come from a :class:`Feed` (the fleet's,
when the router decides at arrival time; its own, when every request was routed ahead of the run), the requests it
must finish are those routed to it, and at each step boundary it publishes its queue lengths and KV usage.
(``sim/runner.py`` is compiled, and was being reworked beside this; extracting its per-engine process into one
shared piece is left for when that settles.)
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import simpy

from sim.engine.core import EngineCore
from sim.engine.request import Request, Status
from sim.errors import EngineAborted
from sim.tables import RequestLog


class Feed:
    """The arrival times a replica may receive requests at, in order, and how many have arrived."""

    __slots__ = ("times", "next", "total")

    def __init__(self, times: np.ndarray) -> None:
        self.times: list[float] = np.asarray(times, dtype=float).tolist()
        self.next = 0
        self.total = len(self.times)


class Replica:
    """An engine core, its client deadlines and its run loop; requests' live state and the request table's
    arrays are the fleet's (``live``, ``log``), indexed by workload row."""

    def __init__(self, index: int, core: EngineCore, feed: Feed, live: dict[int, Request], log: RequestLog,
                 keep_requests: bool, max_sim_time_s: float, publish: bool, own_feed: bool = True) -> None:
        self.index = index
        self.core = core
        self.scheduler = core.scheduler
        self.feed = feed
        #: The feed holds only requests routed here (else every fleet arrival, most of them routed elsewhere).
        self.own_feed = own_feed
        self.live = live
        self.log = log
        self.keep_requests = keep_requests
        self.max_sim_time_s = max_sim_time_s
        #: Requests routed here, and those of them ended (recorded in ``log``) or in ``scheduler.finished``.
        self.assigned = 0
        self.done = 0
        self.deadlines: list[tuple[float, int]] = []
        self.wake: simpy.Event | None = None
        self.aborted: str | None = None
        #: (time, waiting, running, kv blocks used, requests ended) at each step boundary, oldest first, when the
        #: router reads metrics (``publish``); the fleet drops those it no longer needs.
        self.published: deque[tuple[float, int, int, int, int]] | None = deque() if publish else None
        if publish:
            self.published.append((0.0, 0, 0, 0, 0))

    def add(self, req: Request, now: float) -> None:
        """A request routed here arrives."""
        self.assigned += 1
        self.scheduler.add_request(req, now)
        if req.deadline < math.inf:
            heapq.heappush(self.deadlines, (req.deadline, req.index))
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def drain(self) -> None:
        finished = self.scheduler.finished
        if not finished:
            return
        self.log.record_all(finished)
        if not self.keep_requests:
            live = self.live
            for req in finished:
                live.pop(req.index, None)
        self.done += len(finished)
        finished.clear()

    def _next_event_s(self) -> float:
        feed = self.feed
        nxt = feed.times[feed.next] if feed.next < feed.total else math.inf
        if self.deadlines and self.deadlines[0][0] < nxt:
            nxt = self.deadlines[0][0]
        return min(nxt, self.scheduler.next_load_ready_s())

    def _next_deadline_s(self) -> float:
        return self.deadlines[0][0] if self.deadlines else math.inf

    def _expire_deadlines(self, now: float) -> None:
        scheduler = self.scheduler
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, index = heapq.heappop(self.deadlines)
            req = self.live.get(index)
            if req is None:
                continue  # it ended already
            status = Status.TIMED_OUT if req.timeout_at <= req.cancel_at else Status.CANCELLED
            scheduler.abort(req, status, deadline)

    def _pending(self) -> bool:
        """Requests may still come, or some routed here have not ended."""
        feed = self.feed
        return feed.next < feed.total or self.done + len(self.scheduler.finished) < self.assigned

    def process(self, env: simpy.Environment):
        """The replica's SimPy process (``Simulation._engine``, for one engine of several; the checks of
        ``_pending``, ``_next_event_s`` and ``_expire_deadlines`` inlined where they are cheap)."""
        core = self.core
        scheduler = self.scheduler
        feed = self.feed
        times, total = feed.times, feed.total
        pool = scheduler.pool
        published = self.published
        deadlines = self.deadlines
        clock = env.now
        finished = scheduler.finished
        inf = math.inf
        own_feed = self.own_feed
        while feed.next < total or self.done + len(finished) < self.assigned:
            if len(finished) > 256:
                self.drain()
            if env.now < clock and feed.next < total and times[feed.next] <= clock:
                yield env.timeout(clock - env.now)
            now = clock
            if now > self.max_sim_time_s:
                break
            if deadlines and deadlines[0][0] <= now:
                self._expire_deadlines(now)
                if not self._pending():
                    break  # the last requests ended by client deadline
            if published is not None:
                # What vLLM's stats would publish at this boundary: the state before this step is scheduled.
                published.append((now, len(scheduler.waiting), len(scheduler.running), pool.num_used,
                                  self.done + len(finished)))
            step = None
            if scheduler.has_unfinished():
                nxt = times[feed.next] if feed.next < total else inf
                deadline = deadlines[0][0] if deadlines else inf
                try:
                    step = core.begin_step(now, min(nxt, deadline, scheduler.next_load_ready_s()), deadline)
                except EngineAborted as exc:
                    self.aborted = str(exc)
                    break
            if step is None:
                if env.now < clock:
                    yield env.timeout(clock - env.now)
                # A replica behind a router that decides at arrival time sleeps through the fleet's arrivals: one
                # routed here wakes it (``add``), as an arrival wakes the single engine.
                nxt = self._next_event_s() if own_feed else min(deadlines[0][0] if deadlines else inf,
                                                                 scheduler.next_load_ready_s())
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
