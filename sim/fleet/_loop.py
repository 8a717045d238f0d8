"""The fleet's per-arrival loop behind a router that decides at each arrival (``FleetSimulation._route_all``),
compiled with the engine (``sim._compiled.COMPILED``): its calls into the replicas (``EngineLoop.advance``,
``cut``, ``add``) and the request store are native calls, and only the router's own methods run interpreted.
The interpreted source is the same loop (``KVTUNE_PURE_PYTHON``), so decisions cannot differ."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from sim.engine.request import FINAL_STATUSES, Request
from sim.fleet._views import ReplicaView, RequestView
from sim.request_store import RequestStore
from sim.run_loop import EngineLoop, Feed


class RequestViews:
    """Makes the arriving request's view (:class:`RequestView`) from per-request lists made once."""

    def __init__(self, arrivals: list[float], classes: list[str], prompts: list[int], keys: list[tuple[int, ...]],
                 block_size: int, sessions: list[object | None] | None) -> None:
        self.arrivals = arrivals
        self.classes = classes
        self.prompts = prompts
        self.keys = keys
        self.block_size = block_size
        self.sessions = sessions

    def view(self, i: int) -> Any:
        sessions = self.sessions
        return RequestView(i, self.arrivals[i], self.classes[i], self.prompts[i], self.keys[i], self.block_size,
                           None if sessions is None else sessions[i])


def refresh_counts(replicas: list[EngineLoop], views: list[Any], dirty: list[int],
                   follow: Callable[[int, int], None] | None) -> None:
    """The views of the replicas in ``dirty`` (whose counts changed) made again from their counts: ``routed`` and
    ``outstanding`` (sent there, less ended by their last boundary), the engine metrics None; ``follow`` (a router's
    ``load_changed``) told of each new outstanding count.  ``dirty`` is emptied."""
    for r in dirty:
        rep = replicas[r]
        outstanding = rep.assigned - rep.ended_pub
        views[r] = ReplicaView(r, rep.assigned, outstanding)
        if follow is not None:
            follow(r, outstanding)
    dirty.clear()


class Followed:
    """What a ``tracks_requests`` router has been told of its requests' first tokens and ends (called at each
    arrival by :func:`route_all`; the cost follows the first tokens and ends, not the requests in flight).

    Each replica's engine appends a request to its ``news`` list (``SchedulerBase.news``) at the request's first
    token and at its end, as they happen; :meth:`notify` moves them to the replica's watch (request index ->
    request) until what they reported has reached the router.  ``told`` per request: 0 nothing told yet, 1 its
    first token, 2 its end."""

    def __init__(self, news: list[list[Request]], num_requests: int) -> None:
        self.news = news
        self.watch: list[dict[int, Request]] = [{} for _ in news]
        self.told = [0] * num_requests

    def notify(self, router: Any, moved: list[int], now: float) -> None:
        """Tell ``router`` of the first tokens and ends up to ``now`` of the requests on the replicas in ``moved``
        (emptied), per replica in the order a walk over all its requests in routing order would: first tokens,
        then ends.  A first token or end after ``now`` (of a step that ends after the arrival) is kept for a
        later call."""
        told = self.told
        seen: set[int] = set()
        for r in moved:
            if r in seen:
                continue
            seen.add(r)
            watch = self.watch[r]
            news = self.news[r]
            if news:
                for req in news:
                    watch[req.index] = req
                news.clear()
            if not watch:
                continue
            gone: list[int] = []
            for index in sorted(watch) if len(watch) > 1 else list(watch):
                req = watch[index]
                state = told[index]
                if state == 2:  # told already
                    del watch[index]
                    continue
                keep = False
                if state == 0:
                    first = req.first_token_s
                    if first <= now:
                        told[index] = 1
                        router.on_first_token(index, r, first)
                    elif first > now:
                        keep = True  # after this arrival (NaN: none, or taken back by an abort)
                end = req.end_s
                if end <= now or (req.status in FINAL_STATUSES and math.isnan(end)):
                    gone.append(index)
                elif not keep and not end > now:
                    del watch[index]  # nothing more to tell until its next report
            for index in gone:
                router.on_complete(index, r, now)
                told[index] = 2
                del watch[index]
        moved.clear()


def route_all(replicas: list[EngineLoop], store: RequestStore, feed: Feed, requests: RequestViews, router: Any,
              check: Callable[[Any, int], int], replica_of: Any, views: list[Any],
              metric_views: Callable[[float], Any] | None, follow: Callable[[int, int], None] | None,
              dirty: list[int], followed: Followed | None, moved: list[int]) -> float:
    """``FleetSimulation._route_all``'s loop (its docstring says what it does).  ``views``: the views list the
    router is given, kept up to date from the replicas' counts (:func:`refresh_counts`), or ``metric_views``
    (called with the arrival's time) for a router that reads engine metrics; ``notify``: told of each arrival's
    ``followed``: a ``tracks_requests`` router's, told (:meth:`Followed.notify`) after the replicas due were
    advanced, of the replicas that moved (``moved``).  Returns the last arrival's time."""
    route = router.route
    num = len(replicas)
    inf = math.inf
    #: When each replica next acts (a heap entry is live only while it matches this).
    due = [0.0] * num
    heap: list[tuple[float, int]] = [(0.0, r) for r in range(num)]
    again: list[int] = []
    now = 0.0
    for i, now in enumerate(requests.arrivals):
        while heap and heap[0][0] <= now:
            at, r = heapq.heappop(heap)
            if at == due[r]:
                due[r] = -1.0  # taken (a second entry at the same time is stale)
                again.append(r)
        for r in again:
            nxt = replicas[r].advance(now)
            due[r] = nxt
            if nxt < inf:
                heapq.heappush(heap, (nxt, r))
        if followed is not None:
            moved.extend(again)
            followed.notify(router, moved, now)
        again.clear()
        if metric_views is not None:
            given = metric_views(now)
        else:
            if dirty:
                refresh_counts(replicas, views, dirty, follow)
            given = views
        answer = route(requests.view(i), given)
        if type(answer) is int and 0 <= answer < num:
            chosen: int = answer
        else:
            chosen = check(answer, i)
        replica_of[i] = chosen
        feed.next += 1
        rep = replicas[chosen]
        rep.cut(now)  # a run of decode steps under way there ends at this arrival
        rep.add(store.request(i), now)
        dirty.append(chosen)
        clock = rep.clock
        if clock != due[chosen]:
            due[chosen] = clock
            heapq.heappush(heap, (clock, chosen))
        if followed is not None:
            moved.append(chosen)
    return now
