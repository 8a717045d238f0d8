"""The fleet's run loops, compiled with the engine (``sim._compiled.COMPILED``): behind a router that decides at each
arrival (``FleetSimulation._route_all``: :func:`route_all`, with the views it hands the router) and behind one that
routed every request before the run (:func:`preroute`, :func:`run_routed`); the views a router reads every replica's
figures through (:class:`ReplicaViews`, and the fleet's :class:`MetricViews`); and the cost and score passes of
``DynamoKV`` (:func:`least_costs`) and ``LLMDWeighted`` (:func:`llm_d_ties`).  Their calls into the replicas
(``EngineLoop.advance``, ``cut``, ``add``) and the request store are native calls, and only the router's own
methods run interpreted.  The interpreted source is the same code (``KVTUNE_PURE_PYTHON``), so decisions cannot
differ."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mypy_extensions import i64, mypyc_attr

from sim.engine.request import FINAL_STATUSES, Request
from sim.fleet._views import ReplicaView, RequestView
from sim.request_store import RequestStore
from sim.run_loop import EngineLoop, Feed

#: ``tuple.__new__``: a view (a named tuple) made from all its fields in one C call, without the named tuple's own
#: ``__new__`` (generated Python, run interpreted at each call).
_new_tuple: Any = tuple.__new__


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
        return _new_tuple(RequestView, (i, self.arrivals[i], self.classes[i], self.prompts[i], self.keys[i],
                                        self.block_size, None if sessions is None else sessions[i]))


def preroute(router: Any, requests: RequestViews, num: int, check: Callable[[Any, int], int]
             ) -> tuple[list[int], list[list[float]]]:
    """``FleetSimulation._preroute``'s loop (a router with ``needs_state`` false: every request routed before the
    run, each replica's view carrying only ``routed``, the requests sent there so far).  Returns the replica of each
    request and each replica's arrival times, in order."""
    route = router.route
    routed = [0] * num
    views: list[Any] = [_new_tuple(ReplicaView, (r, 0, None, None, None, None)) for r in range(num)]
    replica_of: list[int] = []
    times: list[list[float]] = [[] for _ in range(num)]
    arrivals = requests.arrivals
    for i in range(len(arrivals)):
        answer = route(requests.view(i), views)
        if type(answer) is int and 0 <= answer < num:
            chosen: int = answer
        else:
            chosen = check(answer, i)
        replica_of.append(chosen)
        times[chosen].append(arrivals[i])
        count = routed[chosen] + 1
        routed[chosen] = count
        views[chosen] = _new_tuple(ReplicaView, (chosen, count, None, None, None, None))
    return replica_of, times


def run_routed(replicas: list[EngineLoop], store: RequestStore, arrivals: list[float], replica_of: list[int],
               window: int) -> float:
    """``FleetSimulation.run``'s loop for a fleet routed before the run (``preroute``): each replica's arrivals in
    order, the replicas one after another over each ``window`` of arrivals (a replica's engine stays in the CPU's
    caches while it runs, where taking the arrivals in time order switched engines at every arrival), up to the last
    arrival; returns its time (0 without arrivals).

    The replicas do not interact (the router decided without them; each writes its own requests' rows), so each
    may run ahead of the others.  Each is driven as :func:`route_all` drives a replica (``EngineLoop.advance`` up
    to an arrival when it has something due before it, ``cut`` and ``add`` at each arrival routed to it), at its
    own arrivals only: an engine that is advanced to a time and then to a later one, with no arrival routed to it
    in between, acts as one advanced to the later time alone (its steps and wake-ups are its own; the time it is
    advanced to only says where it stops), so skipping the other replicas' arrivals changes nothing.  ``window``: a
    multiple of ``sim.request_store.LIST_CHUNK``, so that the store makes each chunk of requests once."""
    num = len(replicas)
    total = len(arrivals)
    #: When each replica next acts (``route_all``'s ``due``).
    due = [0.0] * num
    for start in range(0, total, window):
        stop = min(start + window, total)
        mine: list[list[int]] = [[] for _ in range(num)]
        for i in range(start, stop):
            mine[replica_of[i]].append(i)
        for r in range(num):
            rep = replicas[r]
            feed = rep.feed
            nxt = due[r]
            for i in mine[r]:
                now = arrivals[i]
                if nxt <= now:
                    rep.advance(now)
                feed.next += 1
                rep.cut(now)  # a run of decode steps under way there ends at this arrival
                rep.add(store.request(i), now)
                nxt = rep.clock
            due[r] = nxt
    if not total:
        return 0.0
    last = arrivals[total - 1]
    for r in range(num):
        if due[r] <= last:
            replicas[r].advance(last)  # where the arrivals after its own leave it
    return last


class WorkerLoad:
    """One worker's charges in ``DynamoKV``'s slot manager (``DynamoSlots.loads``): prefill tokens of its requests
    not yet at their first token (``tokens``) and prompt blocks of those not yet ended (``blocks``).  As ``i64``
    fields (a boxed int in a ``list[int]`` is ~25 instructions a read with its unboxing), each with its value as a
    float beside it (``ftokens``, ``fblocks``), which :func:`least_load_costs` reads.  The counts are token and
    block sums, far below 2**53, so each float is exact.  Changed only through :meth:`add` and :meth:`set`, which
    keep the two in step."""

    def __init__(self, tokens: i64 = 0, blocks: i64 = 0) -> None:
        self.tokens = tokens
        self.blocks = blocks
        self.ftokens = float(tokens)
        self.fblocks = float(blocks)

    def add(self, tokens: i64, blocks: i64) -> None:
        self.set(self.tokens + tokens, self.blocks + blocks)

    def set(self, tokens: i64, blocks: i64) -> None:
        self.tokens = tokens
        self.blocks = blocks
        self.ftokens = float(tokens)
        self.fblocks = float(blocks)


def least_costs(prefill_tokens: list[int], active_blocks: list[int], overlaps: list[int] | None, prompt: int,
                bs: int, new_blocks: int, scale: float, credit: float) -> list[int]:
    """``DynamoKV``'s workers at the least cost, in index order, from per-worker lists: :func:`least_load_costs` on
    those figures (what the rule as written, ``DynamoKV.route``, calls)."""
    loads = [WorkerLoad(prefill_tokens[w], active_blocks[w]) for w in range(len(prefill_tokens))]
    return least_load_costs(loads, overlaps, prompt, bs, new_blocks, scale, credit)


def least_load_costs(loads: list[WorkerLoad], overlaps: list[int] | None, prompt: i64, bs: i64, new_blocks: i64,
                     scale: float, credit: float) -> list[int]:
    """``DynamoKV``'s workers at the least cost, in index order: each worker's ``worker_logit`` as
    ``DynamoKV._costs_scan`` computes it (the same float operations in the same order, so the same values and the
    same ties) and ``Router._pick_min``'s ties among them, in one compiled pass.  Finite ``scale`` and ``credit``
    only (every cost is then finite, so the least and its ties are those of ``min``); ``overlaps`` None: none."""
    # The prefill as ``float(a) / float(b)``: ``a / b`` for ints below 2**53 (both exact as floats, and each
    # division rounds the exact quotient once), without the int division's call.  The sums ``tokens + prompt`` and
    # ``blocks + new_blocks`` as floats (``WorkerLoad``'s float fields): the same values as the int sums converted,
    # every operand and sum being an integer below 2**53 (exact as a float).  The least's first worker is kept
    # apart and the list of its other ties made only when there are some (a new least is then no list operation).
    first: i64 = 0
    more: list[int] = []
    best = 0.0
    fbs = float(bs)
    fprompt = float(prompt)
    fnew = float(new_blocks)
    w: i64 = 0
    for load in loads:
        prefill = (load.ftokens + fprompt) / fbs
        if overlaps is not None:
            prefill = prefill - credit * overlaps[w]
        if not prefill > 0.0:  # max(0.0, prefill): the first of equals, 0.0
            prefill = 0.0
        cost = scale * prefill + (load.fblocks + fnew)
        if w == 0 or cost < best:
            best = cost
            first = w
            if more:
                more.clear()
        elif cost == best:
            more.append(w)
        w += 1
    if not w:
        return []
    ties = [first]
    if more:
        ties.extend(more)
    return ties


def llm_d_ties(views: ReplicaViews, matched: list[int] | None, blocks: int, prefix_weight: float,
               kv_weight: float, queue_weight: float) -> list[int]:
    """``LLMDWeighted``'s replicas at the highest score, in index order: each replica's score as the router's rule
    computes it (``3 * prefix + 2 * (1 - KV usage) + 2 * queue`` with its weights: the same float operations in
    the same order, so the same values) and ``Router._pick_min``'s ties over the negated scores, in one compiled
    pass.  ``views``: the replicas' published waiting counts and KV usage (:meth:`ReplicaViews.figures`);
    ``matched``: each one's matched prefix blocks (None: none matched anywhere); ``blocks``: the prompt's full
    blocks (0: the prefix term is 0).

    A KV usage the views give as a lower bound makes the replica's negated score a lower bound too (each operation
    is monotone in it for a weight >= 0), so such a replica is read exactly only where that bound is at or below
    the least found: any other cannot be the least or tie with it (as :meth:`MetricViews.least_usage`).  With a
    weight that is not finite every replica is read first."""
    # ``math.isfinite(x)`` for each weight as ``x - x == 0.0`` (0.0 for a finite float; NaN for an infinite or NaN
    # one), without three calls through the module's attribute.
    bounded_ok = (prefix_weight - prefix_weight == 0.0 and kv_weight - kv_weight == 0.0
                  and queue_weight - queue_weight == 0.0)
    figs = views.figures(bounded_ok)
    hi = lo = figs[0].waiting
    for f in figs:  # max() and min() of the waiting counts, on machine integers
        if f.waiting > hi:
            hi = f.waiting
        elif f.waiting < lo:
            lo = f.waiting
    # Each replica's negated score, -(prefix_weight * prefix + kv_weight * (1 - kv) + queue_weight * queue) with
    # prefix = matched / blocks (0.0 without a match) and queue = (hi - waiting) / (hi - lo) (1.0 when all equal),
    # computed in the loop (a call per replica cost more than the score), what does not depend on the replica
    # taken out of it.  Both divisions as ``float(a) / float(b)``: ``a / b`` for ints below 2**53 (both exact as
    # floats, and each division rounds the exact quotient once, as CPython's int true division does for such
    # ints), without the int division's call; ``hi - waiting`` as ``float(hi) - fwaiting`` (the same value: both
    # exact, and so is their difference, an integer below 2**53).
    prefixed = blocks != 0 and matched is not None
    counts: list[int] = matched if matched is not None else []
    spread = hi != lo
    fblocks = float(blocks)
    fhi = float(hi)
    span = float(hi - lo)
    while True:
        # One pass rather than ``min`` and a filter over the scores: the least so far and its replicas (``min``
        # keeps the first value and replaces it by any smaller one, so the same least; no score is NaN with finite
        # weights: KV usage is blocks over a positive count).  The least's first replica is kept apart and its
        # other ties in ``more`` (a new least is then no list made; as ``least_load_costs``).  A bounded replica
        # whose score is above the least so far is above the least too: the others are kept for the pass after it.
        # The lists are made only when something goes in them (most arrivals have no tie and no bound in the way:
        # fewer objects made, fewer collections of the cyclic GC).
        best = 0.0
        first: i64 = 0
        more: list[int] | None = None
        bounds: list[float] | None = None
        bounded: list[int] | None = None
        r: i64 = 0
        for f in figs:
            prefix = 0.0
            if prefixed:
                prefix = float(counts[r]) / fblocks
            queue = (fhi - f.fwaiting) / span if spread else 1.0
            value = -(prefix_weight * prefix + kv_weight * (1.0 - f.usage) + queue_weight * queue)
            if r == 0 or value < best:
                best = value
                first = r
                more = None
            elif value == best:
                if more is None:
                    more = [r]
                else:
                    more.append(r)
            else:
                r += 1
                continue
            if not f.exact:
                if bounds is None or bounded is None:
                    bounds = [value]
                    bounded = [r]
                else:
                    bounds.append(value)
                    bounded.append(r)
            r += 1
        read = False
        if bounds is not None and bounded is not None:
            for k in range(len(bounded)):
                if bounds[k] <= best:
                    views.read(bounded[k])  # its usage grows, or stays; its waiting count is exact already
                    read = True
        if not read:
            ties = [first]
            if more is not None:
                ties.extend(more)
            return ties
        figs = views.figures(True)  # the same objects, read (MetricViews), or made again from the lists


class PrefixIndex:
    """A router-side approximate index of the prompt blocks it sent to one replica: block hash -> when last sent
    (``DynamoSlots.indexes``, ``LLMDScorer.indexes``; compiled, so that a router's match of every replica's index
    at an arrival is native calls).

    The hashes are chained (one names its block and all before it), so the leading blocks found form the longest
    cached prefix, as a radix tree's match would: an approximation of a tree over token blocks (llm-d, Dynamo) at
    the engine's block size.  Entries older than ``ttl_s`` do not match."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def match(self, hashes: tuple[int, ...], now: float, ttl_s: float = math.inf) -> int:
        """The number of leading ``hashes`` held (sent no more than ``ttl_s`` before ``now``).

        A binary search: every insert is a whole chained prefix stamped with one time, so along a chain a held
        hash's predecessors are held and were sent no earlier; "block k matches" is true up to the longest match
        and false after it (what the engine's prefix cache assumes of the same keys, ``sim.runner``)."""
        seen = self.seen
        lo, hi = 0, len(hashes)  # hashes[:lo] match; hashes[hi:] do not
        while lo < hi:
            mid = (lo + hi) >> 1
            t = seen.get(hashes[mid])
            if t is None or now - t > ttl_s:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def insert(self, hashes: tuple[int, ...], now: float) -> None:
        seen = self.seen
        for key in hashes:
            seen[key] = now


class DynamoSlots:
    """``DynamoKV``'s slot manager, compiled: per worker the prefill tokens and active blocks it charges, per request
    what it charged where (``live``: index -> [worker, prefill tokens still counted, blocks]), the approximate
    indexer's per-worker indexes, and the router's decision (:meth:`route`) and hooks (:meth:`first_token`,
    :meth:`complete`) as native methods.  ``DynamoKV`` binds them as its instance's ``route``, ``on_first_token``
    and ``on_complete`` (the fleet's loop then calls no interpreted router code per request); its class methods are
    the rule as written, in terms of the same state, and decide the same (``tests/sim/fleet/test_router_rules.py``).
    ``draw``: the router's tie draw (``Router._draw``)."""

    def __init__(self, num: int, scale: float, credit: float, ttl_s: float, draw: Callable[[int], int]) -> None:
        self.indexes = [PrefixIndex() for _ in range(num)]
        #: Per worker its prefill tokens and active blocks (:class:`WorkerLoad`: machine integers, which the cost
        #: pass reads); the lists :attr:`prefill_tokens` and :attr:`active_blocks` are made from them.
        self.loads = [WorkerLoad() for _ in range(num)]
        self.live: dict[int, list[int]] = {}
        self.scale = scale
        self.credit = credit
        self.ttl_s = ttl_s
        self.draw = draw

    @property
    def prefill_tokens(self) -> list[int]:
        """Per worker: tokens of its requests still in prefill (a new list; set: each worker's from a list)."""
        return [load.tokens for load in self.loads]

    @prefill_tokens.setter
    def prefill_tokens(self, value: list[int]) -> None:
        loads = self._loads_for(value)
        for w in range(len(loads)):
            loads[w].set(value[w], loads[w].blocks)

    @property
    def active_blocks(self) -> list[int]:
        """Per worker: prompt blocks of its requests not yet ended (a new list; set: each worker's from a list)."""
        return [load.blocks for load in self.loads]

    @active_blocks.setter
    def active_blocks(self, value: list[int]) -> None:
        loads = self._loads_for(value)
        for w in range(len(loads)):
            loads[w].set(loads[w].tokens, value[w])

    def _loads_for(self, value: list[int]) -> list[WorkerLoad]:
        if len(value) != len(self.loads):
            raise ValueError(f"{len(value)} figures for {len(self.loads)} workers")
        return self.loads

    def overlaps(self, hashes: tuple[int, ...], now: float) -> list[int]:
        """Each worker's overlap blocks with ``hashes`` at ``now``."""
        ttl_s = self.ttl_s
        return [index.match(hashes, now, ttl_s) for index in self.indexes]

    def route(self, request: Any, replicas: Any) -> int:
        """``DynamoKV.route`` for finite ``scale`` and ``credit`` (:func:`least_costs`'s pass), in one native call:
        the same overlaps, the same ties, the same draw among them (``Router._pick``) and the same bookkeeping."""
        # A RequestView's fields by position (a named tuple's field by name is a generic attribute lookup):
        # block_hashes, arrival_s, prompt_tokens, block_size.
        hashes: tuple[int, ...] = request[4]
        now: float = request[1]
        prompt: int = request[3]
        bs: int = request[5]
        new_blocks = -(-prompt // bs)
        overlaps = self.overlaps(hashes, now) if hashes else None
        ties = least_load_costs(self.loads, overlaps, prompt, bs, new_blocks, self.scale, self.credit)
        chosen = ties[0] if len(ties) == 1 else ties[self.draw(len(ties))]
        self.take(request[0], chosen, overlaps[chosen] if overlaps is not None else 0, prompt, bs, new_blocks,
                  hashes, now)
        return chosen

    def take(self, index: int, chosen: int, overlap: int, prompt: int, bs: int, new_blocks: int,
             hashes: tuple[int, ...], now: float) -> None:
        """Request ``index`` sent to worker ``chosen``: its uncached prefill tokens and its blocks charged there,
        its blocks indexed there."""
        uncached = prompt - overlap * bs
        if uncached < 0:
            uncached = 0
        self.loads[chosen].add(uncached, new_blocks)
        self.live[index] = [chosen, uncached, new_blocks]
        self.indexes[chosen].insert(hashes, now)

    def first_token(self, index: int, replica: int, now: float) -> None:
        """``Router.on_first_token``: the request's prefill tokens no longer charged."""
        entry = self.live.get(index)
        if entry is not None:
            uncounted: int = entry[1]
            if uncounted:
                self.loads[replica].add(-uncounted, 0)
                entry[1] = 0

    def complete(self, index: int, replica: int, now: float) -> None:
        """``Router.on_complete``: nothing of the request charged any more."""
        live = self.live
        entry = live.get(index)
        if entry is not None:
            del live[index]  # (``live.pop(index, None)``: a generic method call)
            uncounted: int = entry[1]
            held: int = entry[2]
            self.loads[replica].add(-uncounted, -held)


class LLMDScorer:
    """``LLMDWeighted``'s decision, compiled: its per-replica prefix indexes and weights, and :meth:`route` (the
    router's ``route`` in one native call: the same matches, the same :func:`llm_d_ties`, the same draw among the
    ties, ``Router._pick``).  ``LLMDWeighted`` binds :meth:`route` as its instance's ``route``; its class method is
    the rule as written over the same state.  ``draw``: the router's tie draw (``Router._draw``)."""

    def __init__(self, num: int, prefix_weight: float, kv_weight: float, queue_weight: float,
                 draw: Callable[[int], int]) -> None:
        self.indexes = [PrefixIndex() for _ in range(num)]
        self.prefix_weight = prefix_weight
        self.kv_weight = kv_weight
        self.queue_weight = queue_weight
        self.draw = draw

    def route(self, request: Any, replicas: Any) -> int:
        # A RequestView's fields by position (as ``DynamoSlots.route``): block_hashes, arrival_s, prompt_tokens,
        # block_size.
        return self.decide(request[4], request[1], request[3], request[5], replicas)

    def route_at(self, requests: RequestViews, i: int, replicas: Any) -> int:
        """:meth:`route` of request ``i`` of ``requests``, from the lists its view is made of, without the view
        (:func:`route_all` calls this where the router's ``route`` is this scorer's: the same fields, the same
        decision; a view costs ~2,300 instructions to make, most of it ``tuple.__new__``)."""
        return self.decide(requests.keys[i], requests.arrivals[i], requests.prompts[i], requests.block_size,
                           replicas)

    def decide(self, hashes: tuple[int, ...], now: float, prompt: int, bs: int, replicas: Any) -> int:
        blocks = prompt // bs if bs else 0
        matched: list[int] | None = None
        if blocks and hashes:
            matched = [index.match(hashes, now) for index in self.indexes]
        ties = llm_d_ties(replica_views(replicas), matched, blocks, self.prefix_weight, self.kv_weight,
                          self.queue_weight)
        chosen = ties[0] if len(ties) == 1 else ties[self.draw(len(ties))]
        self.indexes[chosen].insert(hashes, now)
        return chosen


class Loads:
    """Outstanding requests per replica, and the replicas at each count (in index order): the least and the most
    loaded, and the ties among the least, are read without a scan of the replicas (a router's load index updated
    on its own events; a change costs a bisection in the few replicas at its old and new count).  Compiled with
    the loop that tells it of each change (``refresh_counts``, through ``Router.load_changed``)."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = list(counts)
        self.at: dict[int, list[int]] = {}
        for r, c in enumerate(self.counts):
            self.at.setdefault(c, []).append(r)
        self.lo = min(self.counts)
        self.hi = max(self.counts)

    def set(self, replica: int, value: int) -> None:
        counts = self.counts
        old = counts[replica]
        if old == value:
            return
        counts[replica] = value
        at = self.at
        bucket = at[old]
        if len(bucket) == 1:
            del at[old]
            emptied = True
        else:
            del bucket[bisect.bisect_left(bucket, replica)]
            emptied = False
        others = at.get(value)
        if others is None:
            at[value] = [replica]
        else:
            bisect.insort(others, replica)
        if value < self.lo:
            self.lo = value
        elif emptied and old == self.lo:
            lo = old + 1  # the least moved up, to at most ``value``
            while lo not in at:
                lo += 1
            self.lo = lo
        if value > self.hi:
            self.hi = value
        elif emptied and old == self.hi:
            hi = old - 1
            while hi not in at:
                hi -= 1
            self.hi = hi

    def first_least(self) -> int:
        """The lowest-indexed replica at the least count (``counts.index(min(counts))``)."""
        return self.at[self.lo][0]


def outstanding(rep: EngineLoop) -> int:
    """A replica's ``outstanding`` count: the requests sent there, less those ended by its last boundary."""
    return rep.assigned - rep.ended_pub


def count_view(r: int, rep: EngineLoop) -> Any:
    """Replica ``r``'s view from its counts alone (``routed``, ``outstanding``; the engine metrics None): what a
    router that reads no engine metrics is shown (:func:`refresh_counts`, :class:`CountViews`)."""
    return _new_tuple(ReplicaView, (r, rep.assigned, outstanding(rep), None, None, None))


def refresh_counts(replicas: list[EngineLoop], views: list[Any], dirty: list[int],
                   follow: Callable[[int, int], None] | None) -> None:
    """The views of the replicas in ``dirty`` (whose counts changed) made again from their counts
    (:func:`count_view`); ``follow`` (a router's ``load_changed``) told of each new outstanding count.  ``dirty``
    is emptied."""
    for r in dirty:
        rep = replicas[r]
        views[r] = count_view(r, rep)
        if follow is not None:
            follow(r, outstanding(rep))
    dirty.clear()


class ReplicaFigures:
    """One replica's published waiting count and KV usage (``exact`` false: the usage is a lower bound), as
    :func:`llm_d_ties` reads them (:meth:`ReplicaViews.figures`).  Native fields, which mypyc stores unboxed: a
    boxed float or int in a list costs a list read and an unboxing call at each read (as :class:`WorkerLoad`).
    Counts below 2**53 (exact as floats): the waiting count also as a float (``fwaiting``, which the score reads;
    set with it by :meth:`publish`)."""

    def __init__(self, waiting: i64, usage: float, exact: bool) -> None:
        self.waiting = waiting
        self.fwaiting = float(waiting)
        self.usage = usage
        self.exact = exact

    def publish(self, waiting: i64, usage: float) -> None:
        self.waiting = waiting
        self.fwaiting = float(waiting)
        self.usage = usage


class MetricFigures(ReplicaFigures):
    """A replica's figures as :class:`MetricViews` keeps them: the published figures (its running count too) and
    when to read them again.  ``until``: the cutoff the figures (or the bound) hold until (exclusive; ``-inf``: to
    be read again); ``inner``: the cutoff from which its KV usage may have grown; ``check``: the cutoff from which
    :meth:`MetricViews.refresh` has something to do there (the least of ``until`` and ``inner`` while the figures
    are exact, else ``until``); ``queued``: whether the run of decode steps the figures fall in had requests queued
    during it (its published waiting count grows at the run's boundaries, so it is read again there, not
    bounded)."""

    def __init__(self) -> None:
        super().__init__(0, 0.0, False)
        self.running: i64 = 0
        self.until = -math.inf
        self.inner = math.inf
        self.check = -math.inf
        self.queued = False


# Compiled, and subclassed by interpreted views (a user's) as well as by the fleet's own (MetricViews).
@mypyc_attr(allow_interpreted_subclasses=True)
class ReplicaViews:
    """The replicas as a router sees them at an arrival: a read-only sequence of :class:`ReplicaView` (``len``,
    ``views[r]``, iteration), and the reads of every replica at once that routers make (:meth:`least_usage`,
    :meth:`published`).

    ``ReplicaViews(views)`` wraps any sequence of views (what a test, a user or ``kvtune replay`` hands a router)
    and makes those reads one view at a time.  The fleet hands a router that reads engine metrics its
    :class:`MetricViews`, which keeps the published figures in columns and makes the same reads without making a
    view.  A router takes whatever sequence it is given through :func:`replica_views` and calls the reads on it.
    A subclass implements ``__len__`` and ``__getitem__`` (and may leave ``views`` unset) and inherits the generic
    reads, or makes its own: each must give what the generic one gives on the same views."""

    def __init__(self, views: Sequence[Any] = ()) -> None:
        self.views = views

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, r: int) -> Any:
        return self.views[r]

    def __iter__(self) -> Iterator[Any]:
        return iter([self[r] for r in range(len(self))])

    def least_usage(self) -> list[int]:
        """The replicas at the least published KV usage (``kv_usage``), in index order."""
        usage: list[Any] = [self[r].kv_usage for r in range(len(self))]
        best = min(usage)
        return [r for r in range(len(usage)) if usage[r] == best]

    def published_bounds(self) -> tuple[list[Any], list[Any], list[bool]]:
        """:meth:`published`, and per replica whether its KV usage is exact: where it is not, it is a lower bound
        (its blocks in use can only have grown since; its other figures are exact), which :meth:`read` makes exact
        in the lists returned.  The generic one: every figure exact."""
        waiting, usage = self.published()
        return waiting, usage, [True] * len(waiting)

    def read(self, r: int) -> None:
        """Make replica ``r``'s figures in the lists :meth:`published_bounds` returned exact (generic: they are)."""

    def published(self) -> tuple[list[Any], list[Any]]:
        """Every replica's published waiting count (``num_waiting``) and KV usage (``kv_usage``), by position."""
        views = [self[r] for r in range(len(self))]
        return [v.num_waiting for v in views], [v.kv_usage for v in views]

    def figures(self, bounds: bool) -> list[ReplicaFigures]:
        """Per replica its published waiting count and KV usage as a :class:`ReplicaFigures` (what
        :func:`llm_d_ties` reads): from :meth:`published_bounds` (``bounds``: a KV usage not exact is a lower bound,
        which :meth:`read` makes exact; call this again after a read) or :meth:`published` (all exact).  The generic
        one makes them anew from those lists; :class:`MetricViews` returns its own, which :meth:`read` updates."""
        if bounds:
            waiting, usage, exact = self.published_bounds()
            return [ReplicaFigures(waiting[r], usage[r], exact[r]) for r in range(len(waiting))]
        waiting, usage = self.published()
        return [ReplicaFigures(waiting[r], usage[r], True) for r in range(len(waiting))]


def replica_views(replicas: Sequence[Any]) -> ReplicaViews:
    """``replicas`` as a :class:`ReplicaViews`: itself if it is one, else a sequence of :class:`ReplicaView`
    wrapped (``ReplicaViews(replicas)``)."""
    if isinstance(replicas, ReplicaViews):
        return replicas
    return ReplicaViews(replicas)


class CountViews(ReplicaViews):
    """The replicas as a router that reads no engine metrics and says it does not read its counts
    (``Router.reads_counts`` false) is handed them: each view made from the replica's counts when it is read
    (:func:`count_view`), so the same values as the views list :func:`refresh_counts` keeps for the other routers,
    without making any at an arrival where none is read."""

    def __init__(self, replicas: list[EngineLoop]) -> None:
        self.replicas = replicas

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, r: int) -> Any:
        n = len(self.replicas)
        if r < 0:
            r += n  # as a list's index (the view's own index is the replica's)
        if not 0 <= r < n:
            raise IndexError("replica index out of range")
        return count_view(r, self.replicas[r])


class MetricViews(ReplicaViews):
    """Each replica as a router that reads engine metrics sees it (a :class:`ReplicaViews`, views made on
    demand): its own counts exact, the engine's metrics as published at the last step boundary at or before
    ``cutoff`` (the arrival less the router's lag; every boundary a replica published lies before the arrival:
    ``advance`` stops at the first at or after it; one inside a run of decode steps is computed from the run,
    ``RunRecord``).

    The published figures are kept per replica (``figs``: :class:`MetricFigures`, unboxed), read by position
    (:meth:`least_usage`, :meth:`figures`, :meth:`published`) or as views.  A replica's figures are read again
    (``EngineLoop.metrics_at``) only when they may have changed: when its counts changed or it was advanced since
    (its history grew), or the cutoff reached its next history entry (``until``).  Inside a run of decode steps
    the figures change at each inner boundary, where the blocks in use can only grow: once the cutoff passes the
    next (``inner``) the replica's KV usage is kept as a lower bound (``exact`` false) and read again only when a
    reader needs it (:meth:`least_usage`: only where the bound is at or below the least; any other read: all)."""

    def __init__(self, replicas: list[EngineLoop]) -> None:
        self.replicas = replicas
        #: The cutoff of the figures (it may not decrease).
        self.cutoff = -math.inf
        self.figs = [MetricFigures() for _ in replicas]
        #: At most the least ``check`` of any replica: while the cutoff is below it, :meth:`refresh` has nothing
        #: to do but read the replicas that moved (most arrivals at 64 replicas skip the pass over all of them).
        self.soonest = -math.inf
        #: The lists :meth:`published_bounds` last returned (None: none since the last refresh), which
        #: :meth:`read` keeps exact as its contract says.
        self.bounds: tuple[list[int], list[float], list[bool]] | None = None

    def refresh(self, cutoff: float, dirty: list[int], moved: list[int]) -> None:
        """The figures as of ``cutoff``, which may not decrease from call to call; ``dirty`` (replicas whose counts
        changed: emptied) and ``moved`` (advanced since the last call: left as it is) are read again whatever their
        cutoff."""
        self.cutoff = cutoff
        self.bounds = None
        figs = self.figs
        stale = -math.inf
        for r in dirty:
            figs[r].check = stale
        for r in moved:
            figs[r].check = stale
        # Those read at once (each once: a read leaves ``check`` after the cutoff, above -inf).
        for r in dirty:
            self._read_stale(r)
        for r in moved:
            self._read_stale(r)
        dirty.clear()
        if cutoff < self.soonest:
            return
        soonest = math.inf
        k: i64 = 0
        for f in figs:
            # The rule: read again where ``until <= cutoff or (queued and inner <= cutoff)``, else a bound where
            # ``inner <= cutoff``; ``check`` is the least cutoff at which either applies.
            if f.check <= cutoff:
                if f.until <= cutoff or (f.queued and f.inner <= cutoff):
                    self._read(k)
                else:  # inner <= cutoff: its blocks in use may have grown
                    f.exact = False
                    f.check = f.until
            if f.check < soonest:
                soonest = f.check
            k += 1
        self.soonest = soonest

    def _read_stale(self, r: int) -> None:
        """Replica ``r`` read if marked stale (``check`` -inf)."""
        if self.figs[r].check == -math.inf:
            self._read(r)

    def _read(self, r: int) -> None:
        rep = self.replicas[r]
        f = self.figs[r]
        waiting, running, used, entry, inner = rep.metrics_at(self.cutoff)
        f.publish(waiting, used / rep.scheduler.pool.num_blocks)
        f.running = running
        f.until = entry
        f.inner = inner
        f.exact = True
        f.queued = rep.run_queued()
        f.check = entry if entry < inner else inner
        if f.check < self.soonest:  # (a bounded replica read by a router: its check may come back before)
            self.soonest = f.check
        bounds = self.bounds
        if bounds is not None:
            bounds[0][r] = f.waiting
            bounds[1][r] = f.usage
            bounds[2][r] = True

    def figures(self, bounds: bool) -> list[ReplicaFigures]:
        """The figures themselves (:meth:`ReplicaViews.figures`; without ``bounds``, every one read exactly)."""
        figs = self.figs
        if not bounds:
            for r in range(len(figs)):
                if not figs[r].exact:
                    self._read(r)
        # (A list of the subclass is a list of the class: read only, through the class's fields.)
        given: Any = figs
        return given

    def published(self) -> tuple[list[int], list[float]]:
        """Every replica's published waiting count and KV usage (all read exactly), in new lists."""
        figs = self.figures(False)
        return [f.waiting for f in figs], [f.usage for f in figs]

    def published_bounds(self) -> tuple[list[int], list[float], list[bool]]:
        """:meth:`ReplicaViews.published_bounds` in new lists, which :meth:`read` keeps exact until the next
        refresh: a replica inside a run of decode steps whose cutoff passed its next inner boundary has a lower
        bound for its KV usage; its waiting count is exact (one with requests queued during the run is read again
        at each boundary, ``refresh``)."""
        figs = self.figs
        bounds = ([f.waiting for f in figs], [f.usage for f in figs], [f.exact for f in figs])
        self.bounds = bounds
        return bounds

    def read(self, r: int) -> None:
        if not self.figs[r].exact:
            self._read(r)

    def least_usage(self) -> list[int]:
        """The replicas at the least published KV usage, in index order (``Router._pick_min``'s ties over the
        views' ``kv_usage``), read again only where their bound could be the least: a bound above the least after
        them is below the replica's exact figure too."""
        figs = self.figs
        while True:
            best = figs[0].usage
            for f in figs:  # min() of the usage (none is NaN: blocks over a positive count)
                if f.usage < best:
                    best = f.usage
            read = False
            r: i64 = 0
            for f in figs:
                if not f.exact and f.usage <= best:
                    self._read(r)  # it grows, or stays
                    read = True
                r += 1
            if not read:
                return [r for r in range(len(figs)) if figs[r].usage == best]

    def __len__(self) -> int:
        return len(self.figs)

    def __getitem__(self, r: int) -> Any:
        f = self.figs[r]
        if not f.exact:
            self._read(r)
        rep = self.replicas[r]
        return _new_tuple(ReplicaView, (r, rep.assigned, outstanding(rep), f.waiting, f.running, f.usage))


class Followed:
    """What a ``tracks_requests`` router has been told of its requests' first tokens and ends (called at each
    arrival by :func:`route_all`; the cost follows the first tokens and ends, not the requests in flight).

    Each replica's engine appends a request to its ``news`` list (``SchedulerBase.news``) at the request's first
    token and at its end, as they happen; :meth:`notify` moves them to the replica's watch (its requests in the
    order they were first moved there, each once) until what they reported has reached the router.  ``told`` per
    request: 0 nothing told yet, 1 its first token, 2 its end."""

    def __init__(self, news: list[list[Request]], num_requests: int) -> None:
        self.news = news
        # The watch as a list and a flag per request (``watching``: in its replica's watch), not a dict keyed by
        # request index: no boxed index and no hashing per entry.  The list keeps a dict's order (insertion; an
        # entry taken out and moved back goes to the end).
        self.watch: list[list[Request]] = [[] for _ in news]
        self.watching = [False] * num_requests
        self.told = [0] * num_requests
        #: :meth:`notify`'s calls, and per replica the last call that told of it.
        self.calls = 0
        self.seen = [0] * len(news)
        #: The router's hooks at the last call, and the slot manager they are the methods of (None: not one's).
        self.hooks: tuple[object, object] = (None, None)
        self.slots: DynamoSlots | None = None

    def notify(self, router: Any, moved: list[int], now: float) -> None:
        """Tell ``router`` of the first tokens and ends up to ``now`` of the requests on the replicas in ``moved``
        (emptied), per replica in the order a walk over all its requests in routing order would: first tokens,
        then ends.  A first token or end after ``now`` (of a step that ends after the arrival) is kept for a
        later call."""
        told = self.told
        on_first = router.on_first_token
        on_end = router.on_complete
        # Fast path: hooks that are a compiled slot manager's methods (``DynamoKV``'s) are called as native methods
        # (the same calls, in the same order, without the generic call of a bound method).  Found again only when
        # the hooks are other objects than at the last call (an instance's bound hooks are the same from call to
        # call).
        if on_first is not self.hooks[0] or on_end is not self.hooks[1]:
            self.hooks = (on_first, on_end)
            self.slots = None
            owner = getattr(on_first, "__self__", None)
            if isinstance(owner, DynamoSlots) and on_first == owner.first_token and on_end == owner.complete:
                self.slots = owner
        slots = self.slots
        # Each replica once (``moved`` may name one several times): marked with this call's number, not a set.
        self.calls += 1
        call = self.calls
        seen = self.seen
        watching = self.watching
        for r in moved:
            if seen[r] == call:
                continue
            seen[r] = call
            watch = self.watch[r]
            news = self.news[r]
            if news:
                for req in news:
                    if not watching[req.index]:  # (else in the watch already: it keeps its place)
                        watching[req.index] = True
                        watch.append(req)
                news.clear()
            if not watch:
                continue
            gone: list[int] = []
            dropped = False
            # The walk is in routing order (request index) for hooks in general.  The slot manager's hooks commute:
            # ``first_token(i)``/``complete(i)`` touch request i's own ``live`` entry and subtract
            # integers from its replica's counters (exact, so in any order the same sums), and request i's first
            # token is still told before its end (the walk, then ``gone``); so there the walk takes the watch in
            # its own order, unsorted (tests/sim/fleet/test_router_rules.py: the same state as the sorted walk).
            # A request leaves the watch by its flag during the walk (the list is not changed while walked), and
            # the list is compacted after it, in its own order.
            for req in watch if slots is not None or len(watch) < 2 else sorted(watch, key=request_index):
                index = req.index
                state = told[index]
                if state == 2:  # told already
                    watching[index] = False
                    dropped = True
                    continue
                keep = False
                if state == 0:
                    first = req.first_token_s
                    if first <= now:
                        told[index] = 1
                        if slots is not None:
                            slots.first_token(index, r, first)
                        else:
                            on_first(index, r, first)
                    elif first > now:
                        keep = True  # after this arrival (NaN: none, or taken back by an abort)
                end = req.end_s
                if end <= now or (req.status in FINAL_STATUSES and math.isnan(end)):
                    gone.append(index)
                elif not keep and not end > now:
                    watching[index] = False  # nothing more to tell until its next report
                    dropped = True
            for index in gone:
                if slots is not None:
                    slots.complete(index, r, now)
                else:
                    on_end(index, r, now)
                told[index] = 2
                watching[index] = False
                dropped = True
            if dropped:
                kept = 0
                for req in watch:
                    if watching[req.index]:
                        watch[kept] = req
                        kept += 1
                while len(watch) > kept:
                    watch.pop()
        moved.clear()


def request_index(req: Request) -> int:
    """A request's index (:meth:`Followed.notify`'s sort key)."""
    return req.index


class DueHeap:
    """A min-heap of ``(time, replica)`` pairs, ordered as tuples are (by time, then replica), in two parallel
    lists: :func:`route_all`'s heap of when each replica next acts.  ``heapq`` on tuples compares them through
    their rich comparison at each level (some 2,700 instructions a pop among 64 replicas); here a comparison is
    two unboxed reads.  A heap's pops are its values in order whatever its layout (equal pairs are the same
    pair), so the replicas come out as ``heapq``'s would."""

    def __init__(self, num: int) -> None:
        #: (time 0.0, replica r) for each replica: in order, so already a heap.
        self.times: list[float] = [0.0] * num
        self.replicas: list[int] = list(range(num))

    def __len__(self) -> int:
        return len(self.times)

    def top(self) -> float:
        """The least time (the heap is not empty)."""
        return self.times[0]

    def push(self, t: float, r: int) -> None:
        times = self.times
        replicas = self.replicas
        # The same lists as boxed objects: a pair moves as its two objects (no new float or int per level).
        tboxes: list[Any] = times
        rboxes: list[Any] = replicas
        times.append(t)
        replicas.append(r)
        pos = len(times) - 1
        tbox = tboxes[pos]
        rbox = rboxes[pos]
        while pos > 0:  # sift up: the new pair moves above each parent greater than it
            parent = (pos - 1) >> 1
            pt = times[parent]
            if t < pt or (t == pt and r < replicas[parent]):
                tboxes[pos] = tboxes[parent]
                rboxes[pos] = rboxes[parent]
                pos = parent
            else:
                break
        tboxes[pos] = tbox
        rboxes[pos] = rbox

    def pop(self) -> int:
        """Take the least pair out; returns its replica (its time was :meth:`top`)."""
        times = self.times
        replicas = self.replicas
        tboxes: list[Any] = times  # (as in :meth:`push`: pairs move as their objects)
        rboxes: list[Any] = replicas
        first = replicas[0]
        n = len(times) - 1
        t = times[n]
        r = replicas[n]
        tbox = tboxes.pop()
        rbox = rboxes.pop()
        if n:
            pos = 0
            while True:  # sift down: the last pair goes below each smaller child
                child = 2 * pos + 1
                if child >= n:
                    break
                ct = times[child]
                cr = replicas[child]
                right = child + 1
                if right < n:
                    rt = times[right]
                    if rt < ct or (rt == ct and replicas[right] < cr):
                        child = right
                        ct = rt
                        cr = replicas[right]
                if ct < t or (ct == t and cr < r):
                    tboxes[pos] = tboxes[child]
                    rboxes[pos] = rboxes[child]
                    pos = child
                else:
                    break
            tboxes[pos] = tbox
            rboxes[pos] = rbox
        return first


def route_all(replicas: list[EngineLoop], store: RequestStore, feed: Feed, requests: RequestViews, router: Any,
              check: Callable[[Any, int], int], replica_of: Any, views: Any, reads_metrics: bool,
              metrics_lag: float, follow: Callable[[int, int], None] | None,
              dirty: list[int], followed: Followed | None, moved: list[int]) -> float:
    """``FleetSimulation._route_all``'s loop (its docstring says what it does).  ``views``: the views list the
    router is given, kept up to date from the replicas' counts (:func:`refresh_counts`), or a :class:`CountViews`
    (made when read: nothing to keep); a router that reads engine
    metrics (``reads_metrics``) is given a :class:`MetricViews` instead, brought up to date at each arrival
    (``metrics_lag`` old); ``followed``: a ``tracks_requests`` router's, told (:meth:`Followed.notify`) after the replicas due were
    advanced, of the replicas that moved (``moved``).  Returns the last arrival's time."""
    route = router.route
    # Fast path: a ``route`` that is a compiled ``LLMDScorer``'s (``LLMDWeighted``'s) is called as its native
    # ``route_at``, which decides from the request's fields without its view made (as ``Followed.notify`` finds
    # the slot manager's hooks).
    owner = getattr(route, "__self__", None)
    scorer = owner if isinstance(owner, LLMDScorer) and route == owner.route else None
    num = len(replicas)
    inf = math.inf
    metrics = MetricViews(replicas) if reads_metrics else None
    on_demand = isinstance(views, CountViews)
    #: When each replica next acts (a heap entry is live only while it matches this).
    due = [0.0] * num
    heap = DueHeap(num)
    again: list[int] = []
    now = 0.0
    for i, now in enumerate(requests.arrivals):
        while len(heap) and heap.top() <= now:
            at = heap.top()
            r = heap.pop()
            if at == due[r]:
                due[r] = -1.0  # taken (a second entry at the same time is stale)
                again.append(r)
        for r in again:
            nxt = replicas[r].advance(now)
            due[r] = nxt
            if nxt < inf:
                heap.push(nxt, r)
        if followed is not None:
            moved.extend(again)
            followed.notify(router, moved, now)
        if metrics is not None:
            metrics.refresh(now - metrics_lag, dirty, again)
            again.clear()
            given: Any = metrics
        else:
            again.clear()
            if dirty:
                if on_demand:
                    dirty.clear()  # nothing kept to bring up to date: each view is made when read
                else:
                    refresh_counts(replicas, views, dirty, follow)
            given = views
        if scorer is not None:
            answer: Any = scorer.route_at(requests, i, given)
        else:
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
            heap.push(clock, chosen)
        if followed is not None:
            moved.append(chosen)
    return now
