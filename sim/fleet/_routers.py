"""Routers: the interface, the registry by name with validated parameters, and the routers kvtune models.

Each router follows a published rule; the comment on its class names the source, version and file.  No code is
copied from them.  Ties the source breaks at random are broken with the router's seeded generator, so a run is
reproducible.
"""

from __future__ import annotations

import abc
import bisect
import hashlib
import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from sim.errors import ConfigError, short_repr
from sim.fleet._loop import DynamoSlots, LLMDScorer, Loads, least_costs, llm_d_ties, replica_views
from sim.fleet._views import ReplicaView, RequestView


@dataclass(frozen=True)
class Param:
    """A router parameter: its default and its allowed range (``low``/``high`` inclusive unless ``*_open``)."""

    default: float | int
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    integer: bool = False
    doc: str = ""

    def check(self, router: str, name: str, value: object) -> float | int:
        field = f"router_params.{name}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(field, f"{router}: expected a number, got {short_repr(value)}")
        if self.integer and float(value) != int(value):
            raise ConfigError(field, f"{router}: expected an integer, got {short_repr(value)}")
        if math.isnan(value) or value < self.low or value > self.high or (self.low_open and value == self.low):
            lo = "(" if self.low_open else "["
            raise ConfigError(field, f"{router}: {short_repr(value)} is out of range {lo}{self.low}, {self.high}]")
        return int(value) if self.integer else float(value)


class Router(abc.ABC):
    """Picks the replica of each arriving request.

    ``route`` sees only the request and the replicas as a real router sees them (:class:`ReplicaView`), at the
    request's arrival; it returns a replica index.  ``replicas`` is any sequence of views; a router that reads every
    replica's published figures at once takes it through ``replica_views`` (a :class:`ReplicaViews`: the fleet's own,
    which reads its columns, or a plain sequence wrapped, read view by view) and calls ``least_usage()``,
    ``published()`` or ``published_bounds()`` (KV usage lower bounds, made exact by ``read(r)``) on it.  A router with ``needs_state = False`` decides from the request
    and its own past decisions alone: the fleet routes every request through it before the run (then its views
    carry no load), which lets each replica look ahead to its own next arrival, as a single engine does.
    A router with ``reads_metrics = False`` reads only its own counts (``routed``, ``outstanding``): its views carry
    no engine metrics (None), and the fleet neither records the engines' metrics nor makes every replica's view
    again at each arrival, only those whose counts changed (or, with ``reads_counts = False``, each view when
    read).
    A router with ``tracks_requests = True`` is told when each of its requests' first token and end reach it
    (:meth:`on_first_token`, :meth:`on_complete`), before the next ``route`` call that comes after them.
    """

    #: The registry name.
    name: ClassVar[str]
    #: The parameters it accepts (``router_params``), with defaults and ranges.
    params: ClassVar[dict[str, Param]] = {}
    needs_state: ClassVar[bool] = True
    reads_metrics: ClassVar[bool] = True
    tracks_requests: ClassVar[bool] = False
    #: True for a router that decides from the replicas' ``outstanding`` counts alone and keeps them in a
    #: :class:`_Loads` when told of each change (:meth:`follow_loads`, :meth:`load_changed`).
    follows_loads: ClassVar[bool] = False
    #: False for a router with ``reads_metrics = False`` that decides without its views' counts (it may still
    #: read them): the fleet hands it views made when read (``sim.fleet._loop.CountViews``, the same values)
    #: rather than making each replica's view again whenever its counts change.
    reads_counts: ClassVar[bool] = True

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        self.num_replicas = num_replicas
        self._draws: _TieDraws | None = None
        self.rng = np.random.default_rng(seed)
        for key, value in params.items():
            setattr(self, key, value)
        #: The views list the fleet keeps (:meth:`follow_loads`), and the loads in it, kept up to date.
        self._followed: object = None
        self._loads: _Loads | None = None

    def follow_loads(self, views: Sequence[ReplicaView]) -> None:
        """The fleet keeps ``views`` (one list, replaced in place) and calls :meth:`load_changed` whenever a
        replica's ``outstanding`` there changes: ``route`` called with that very list then reads the loads from an
        index kept on those changes instead of scanning every replica (the same decision: the same least loaded,
        the same ties in the same order).  Called with any other sequence, it scans as before."""
        self._followed = views
        self._loads = _Loads([r.outstanding or 0 for r in views])

    def load_changed(self, replica: int, outstanding: int) -> None:
        """Replica ``replica``'s outstanding count in the followed views is now ``outstanding``."""
        loads = self._loads
        if loads is not None:
            loads.set(replica, outstanding)

    @property
    def rng(self) -> np.random.Generator:
        """The router's seeded generator.  Its tie draws (:meth:`_draw`) read its bit generator directly; reading
        ``rng`` hands their buffered half word back first, so any use of it continues the same stream."""
        draws = self._draws
        if draws is not None:
            draws.hand_back()
            self._draws = None
        return self._rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        if self._draws is not None:
            self._draws.hand_back()
            self._draws = None
        self._rng = value

    def _draw(self, n: int) -> int:
        """``self.rng.integers(n)`` (``n >= 1``): the same number and the same generator state after it."""
        draws = self._draws
        if draws is None:
            draws = self._draws = _TieDraws(self._rng)
        return draws.below(n)

    def _followed_loads(self, replicas: Sequence[ReplicaView]) -> _Loads | None:
        return self._loads if replicas is self._followed else None

    @property
    def metrics_lag(self) -> float:
        """How old the engine metrics it reads are (its poll interval); 0 for routers that read none."""
        return float(getattr(self, "metrics_lag_s", 0.0))

    @abc.abstractmethod
    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        """The replica for ``request``."""

    def on_first_token(self, index: int, replica: int, now: float) -> None:  # noqa: B027 - optional hook
        """Request ``index``'s first token reached the router (``tracks_requests`` routers only)."""

    def on_complete(self, index: int, replica: int, now: float) -> None:  # noqa: B027 - optional hook
        """Request ``index``'s response ended (finished, aborted or rejected; ``tracks_requests`` routers only)."""

    def _pick(self, ties: list[int]) -> int:
        """One of ``ties`` (replicas at the best value, in index order), drawn at random (seeded) when several."""
        return ties[0] if len(ties) == 1 else ties[self._draw(len(ties))]

    def _pick_min(self, values: Sequence[float]) -> int:
        """The index of the smallest value, a tie broken at random (seeded)."""
        best = min(values)
        return self._pick([i for i, v in enumerate(values) if v == best])

    def _pick_least_loaded(self, loads: _Loads) -> int:
        """:meth:`_pick_min` over the followed loads: the replicas at the least count in index order, one drawn
        when several (the same draw as the scan's)."""
        return self._pick(loads.at[loads.lo])


class _TieDraws:
    """``Generator.integers(n)`` of numpy's PCG64 generator, drawn in Python from its bit generator's raw 64-bit
    outputs: a tie among a few replicas is drawn at most arrivals, and numpy's call costs several times the draw.

    numpy 2.x (numpy/random/src/distributions/distributions.c, ``random_bounded_uint64_fill`` for a range below
    2**32: ``buffered_bounded_lemire_uint32``) draws ``n`` values below 2**32 by Lemire's multiply-and-reject on 32-bit
    words, which PCG64 (``pcg64_next32``) takes as the low then the high half of one 64-bit output, keeping the high
    half (``has_uint32``, ``uinteger``) for the next word.  The half word lives here while draws are taken and is
    handed back to the generator's state (:meth:`hand_back`) before anything else uses the generator
    (``Router.rng``); larger ranges and other generators are left to numpy."""

    __slots__ = ("bits", "exact", "generator", "half", "has")

    def __init__(self, generator: np.random.Generator) -> None:
        self.generator = generator
        self.bits = generator.bit_generator
        state = self.bits.state
        self.exact = state.get("bit_generator") == "PCG64"
        self.has = self.half = 0
        if self.exact:
            self._take()

    def _take(self) -> None:
        """The generator's buffered half word, drawn from here from now on (PCG64)."""
        state = self.bits.state
        self.has, self.half = int(state["has_uint32"]), int(state["uinteger"])

    def _word(self) -> int:
        if self.has:
            self.has = 0
            return self.half
        raw = self.bits.random_raw()
        self.has = 1
        self.half = raw >> 32
        return raw & 0xFFFFFFFF

    def below(self, n: int) -> int:
        if n <= 1:
            return 0  # numpy returns the low end without a draw
        if not self.exact or n > 0xFFFFFFFF:
            self.hand_back()
            value = int(self.generator.integers(n))
            if self.exact:  # numpy may have taken or left a half word (2**32 draws one 32-bit word): take it again
                self._take()
            return value
        m = self._word() * n
        if (m & 0xFFFFFFFF) < n:
            threshold = (0xFFFFFFFF - (n - 1)) % n
            while (m & 0xFFFFFFFF) < threshold:
                m = self._word() * n
        return m >> 32

    def hand_back(self) -> None:
        """The buffered half word back into the generator's state (nothing to do for another bit generator)."""
        if not self.exact:
            return
        state = self.bits.state
        state["has_uint32"], state["uinteger"] = self.has, self.half
        self.bits.state = state
        # The generator may now be used directly: take its buffer again at the next draw.
        self.has = int(state["has_uint32"])


#: The load index (compiled with the fleet's loop).
_Loads = Loads


_REGISTRY: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    """Add a router class to the registry under its ``name`` (a class decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def router_names() -> list[str]:
    return sorted(_REGISTRY)


def router_class(name: str) -> type[Router]:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError("router", f"unknown router {short_repr(name)}; known: {', '.join(router_names())}") from None


def make_router(name: str, params: Mapping[str, object] | None, num_replicas: int, seed: int = 0) -> Router:
    """The router ``name`` for ``num_replicas`` replicas, its ``params`` checked against its declared ranges
    (ConfigError naming the field: ``router``, ``replicas`` or ``router_params.<name>``)."""
    cls = router_class(name)
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
        raise ConfigError("replicas", f"expected an integer >= 1, got {short_repr(num_replicas)}")
    params = dict(params or {})
    unknown = sorted(set(params) - set(cls.params))
    if unknown:
        known = ", ".join(sorted(cls.params)) or "none"
        raise ConfigError(f"router_params.{unknown[0]}", f"{name} has no such parameter (it takes: {known})")
    values = {key: spec.check(name, key, params.get(key, spec.default)) for key, spec in cls.params.items()}
    return cls(int(num_replicas), seed, **values)


# ---- the routers ------------------------------------------------------------------------------------------------
@register_router
class RoundRobin(Router):
    """Request ``i`` to replica ``i mod N``.
    Source: sglang-router 0.3.2 (sgl-router src/policies/round_robin.rs), vLLM production-stack
    (src/vllm_router/routers/routing_logic.py RoundRobinRouter): a counter over the workers in a fixed order."""

    name = "round_robin"
    needs_state = False

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        super().__init__(num_replicas, seed, **params)
        self._next = 0

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        chosen = self._next % self.num_replicas
        self._next += 1
        return chosen


@register_router
class LeastOutstanding(Router):
    """The replica with the fewest requests in flight from this router (sent, response not ended); ties at random.
    Source: AWS Elastic Load Balancing, Application Load Balancer target groups, routing algorithm
    ``least_outstanding_requests`` (docs "Routing algorithms"); the same load sglang-router's cache_aware falls back
    to (sgl-router src/policies/cache_aware.rs, ``worker.load()``)."""

    name = "least_outstanding"
    reads_metrics = False
    follows_loads = True

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        loads = self._followed_loads(replicas)
        if loads is not None:
            return self._pick_least_loaded(loads)
        return self._pick_min([r.outstanding for r in replicas])


@register_router
class LeastKVUsage(Router):
    """The replica with the lowest published KV-cache usage; ties at random.
    Source: llm-d inference scheduler v0.2 / gateway-api-inference-extension v0.5, the ``kv-cache-utilization-
    scorer`` (pkg/epp/scheduling/framework/plugins/scorer/kvcache_utilization.go: score = 1 - KVCacheUsagePercent)
    alone under the ``max-score-picker`` (ties shuffled).  Its metrics are scraped from vLLM's /metrics every
    ``metrics_lag_s`` (GIE ``--refresh-metrics-interval``, default 50 ms)."""

    name = "least_kv_usage"
    params = {"metrics_lag_s": Param(0.05, 0.0, 3600.0, doc="age of the scraped metrics (s)")}

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        return self._pick(replica_views(replicas).least_usage())


@register_router
class SGLangCacheAware(Router):
    """Prefix-aware with a load-imbalance fallback: the ``cache_aware`` policy of sglang-router 0.3.2, the PyPI wheel
    built from sgl-model-gateway ("smg") at its release commit c7f9bf9 (2026-01-15; now github.com/lightseekorg/smg):
    src/policies/cache_aware.rs (``select_worker``) and src/policies/tree.rs (``prefix_match_with_counts``,
    ``insert``); defaults from the wheel's ``launch_router --help``: cache_threshold 0.3, balance_abs_threshold 64,
    balance_rel_threshold 1.5 (eviction every 60 s down to max_tree_size 2**26 characters per worker).

    Load is the router's in-flight count per worker (0.3.2 counts a cache_aware request from its dispatch until its
    response body, streamed or not, has been passed on: src/routers/http/router.rs, ``WorkerLoadGuard``).  Per
    request, in this order:

    - imbalanced ((max - min) > balance_abs_threshold and max > balance_rel_threshold * min): the least-loaded
      worker, the first of equals;
    - else the prompt is matched against one tree shared by all workers: the longest prefix any worker's requests
      have left in it.  If that prefix is more than cache_threshold of the prompt, the worker that owns the deepest
      matched node: the one whose request first reached that node (the tree keeps its creator as the node's tenant
      while it stays attached, even after other workers have passed through);
    - else (a miss) the least-loaded worker, the first of equals.  (Older sgl-router releases took the worker with
      the smallest tree here; sglang PR #14650, in 0.3.2, changed it to the least loaded.)

    The chosen worker's path in the tree takes the whole prompt either way, at routing time (nothing is learnt from
    responses).  The first of equals is the first worker in the router's worker list; here replica 0, the lowest
    index (for identical replicas the labels carry no meaning).

    Mapping: sglang's tree is over the prompt's text, matched character by character, and the match rate is matched
    characters over prompt characters.  kvtune sees the trace's chained block hashes at the engine's block size, so
    a node here is a block: the match is the leading blocks any worker has been sent, the rate matched blocks x block
    size over prompt tokens (equal to the character rate when characters per token are even over the prompt; a
    match inside a block, which sglang counts by the character, counts nothing here), and a block's owner is the
    replica first sent it.  Not modelled: the LRU eviction (it starts only past 2**26 characters per worker, some
    16 million tokens at 4 characters each) and a worker's removal (it takes its tenancy out of the tree)."""

    name = "sglang_cache_aware"
    reads_metrics = False
    follows_loads = True
    params = {
        "cache_threshold": Param(0.3, 0.0, 1.0),
        "balance_abs_threshold": Param(64, 0, math.inf, integer=True),
        "balance_rel_threshold": Param(1.5, 1.0, math.inf),
    }

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        super().__init__(num_replicas, seed, **params)
        #: block hash -> the replica first sent it (the tree node's tenant)
        self.owner: dict[int, int] = {}

    def _matched_blocks(self, hashes: tuple[int, ...]) -> int:
        """Leading ``hashes`` held by the shared tree (a binary search: a chained prefix is inserted whole)."""
        owner = self.owner
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) >> 1
            if hashes[mid] in owner:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        followed = self._followed_loads(replicas)
        if followed is not None:
            hi, lo = followed.hi, followed.lo
        else:
            loads = [r.outstanding for r in replicas]
            hi, lo = max(loads), min(loads)
        hashes = request.block_hashes
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            chosen = -1
        else:
            matched = self._matched_blocks(hashes) if hashes else 0
            rate = matched * request.block_size / request.prompt_tokens if request.prompt_tokens else 0.0
            chosen = self.owner[hashes[matched - 1]] if matched and rate > self.cache_threshold else -1
        if chosen < 0:  # the least loaded, the first of equals
            chosen = followed.first_least() if followed is not None else loads.index(lo)
        owner = self.owner
        for key in hashes:
            owner.setdefault(key, chosen)
        return chosen


@register_router
class LLMDWeighted(Router):
    """llm-d's weighted scorers: score = 3 * prefix + 2 * kv-utilization + 2 * queue, the highest wins (ties at
    random).  Weights: llm-d's inference-scheduling well-lit path (guides/inference-scheduling, its GAIE Helm
    values ``pluginsCustomConfig``, llm-d 0.2/0.3: prefix-cache-scorer 3, kv-cache-utilization-scorer 2,
    queue-scorer 2, max-score-picker).  Scorers (gateway-api-inference-extension v0.5,
    pkg/epp/scheduling/framework/plugins/): prefix = matched blocks / prompt blocks from the approximate
    prefix index of what it routed (prefix/plugin.go, LRU per server); kv-utilization = 1 - KV usage; queue =
    (max - waiting) / (max - min) over the candidates, 1 when all equal (queue.go, vLLM's num_requests_waiting).
    KV usage and the waiting count are scraped metrics, ``metrics_lag_s`` old (``--refresh-metrics-interval``,
    default 50 ms).  Approximation: GIE hashes 64-character prompt blocks; here the trace's block hashes."""

    name = "llm_d_weighted"
    params = {
        "prefix_weight": Param(3.0, 0.0, math.inf),
        "kv_weight": Param(2.0, 0.0, math.inf),
        "queue_weight": Param(2.0, 0.0, math.inf),
        "metrics_lag_s": Param(0.05, 0.0, 3600.0),
    }

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        super().__init__(num_replicas, seed, **params)
        self._scorer = LLMDScorer(num_replicas, self.prefix_weight, self.kv_weight, self.queue_weight, self._draw)
        self.indexes = self._scorer.indexes
        # Fast path: the compiled scorer's ``route`` (the same matches, scores, ties and draw as the method below,
        # in one native call; the fleet then runs no interpreted code of this router per arrival).
        self.route = self._scorer.route  # type: ignore[method-assign]

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        """The rule as written (the instance's ``route`` is the compiled scorer's, which decides the same)."""
        hashes, now = request.block_hashes, request.arrival_s
        blocks = request.prompt_tokens // request.block_size if request.block_size else 0
        # Scored in one compiled pass (``llm_d_ties``); no hash matches anywhere (prefix 0) when there are none.
        matched = [index.match(hashes, now) for index in self.indexes] if blocks and hashes else None
        chosen = self._pick(llm_d_ties(replica_views(replicas), matched, blocks, self.prefix_weight, self.kv_weight,
                                       self.queue_weight))
        self.indexes[chosen].insert(hashes, now)
        return chosen


@register_router
class DynamoKV(Router):
    """Dynamo's KV router cost, lowest wins (temperature 0; ties at random):
    ``prefill_load_scale * max(0, prefill_blocks - overlap_credit * overlap_blocks) + decode_blocks``
    (ai-dynamo/dynamo v1.3.1, lib/kv-router/src/scheduling/selector.rs ``worker_logit``; defaults
    prefill_load_scale 1.0, overlap score credit 1.0; docs design_docs/router_design.md).

    Per worker, tracked by the router as its slot manager does: prefill blocks = tokens of its requests still
    in prefill (routed, no first token yet; less what was predicted cached) plus this prompt, over the block size;
    decode blocks = the prompt blocks of its requests not yet ended, plus this prompt's.  Overlap blocks come from
    the approximate indexer (Dynamo's ``--no-kv-events`` mode: the cache predicted from its own routing, entries
    expiring after ``ttl_s``, default 120 s), not from the engines' KV events."""

    name = "dynamo_kv"
    reads_metrics = False
    reads_counts = False  # its own slot manager's counts only
    tracks_requests = True
    params = {
        "prefill_load_scale": Param(1.0, 0.0, math.inf),
        "overlap_credit": Param(1.0, 0.0, math.inf),
        "ttl_s": Param(120.0, 0.0, math.inf, low_open=True),
    }

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        super().__init__(num_replicas, seed, **params)
        #: The slot manager's state (per worker, per request) and the indexer, compiled with the fleet's loop.
        self._slots = DynamoSlots(num_replicas, self.prefill_load_scale, self.overlap_credit, self.ttl_s, self._draw)
        self.indexes = self._slots.indexes
        # The hooks are the slot manager's native methods (the fleet calls them for each request's first token and
        # end): the same bookkeeping as the methods below.
        self.on_first_token = self._slots.first_token  # type: ignore[method-assign]
        self.on_complete = self._slots.complete  # type: ignore[method-assign]
        #: A decision's costs and ties in one compiled pass (``sim.fleet._loop.least_costs``), for finite
        #: parameters; else one worker at a time (:meth:`_costs_scan`), which gives the same values.
        self._compiled = math.isfinite(self.prefill_load_scale) and math.isfinite(self.overlap_credit)

    @property
    def _compiled(self) -> bool:
        return self._fast

    @_compiled.setter
    def _compiled(self, value: bool) -> None:
        # Fast path: with the compiled pass, the instance's ``route`` is the slot manager's (``DynamoSlots.route``:
        # the same overlaps, ties, draw and bookkeeping as the method below, in one native call).
        self._fast = value
        if value:
            self.route = self._slots.route  # type: ignore[method-assign]
        else:
            self.__dict__.pop("route", None)

    # The router's state is the slot manager's (one copy, whichever route runs).
    @property
    def prefill_tokens(self) -> list[int]:
        """Per worker: tokens of its requests still in prefill, from the slot manager (a new list: set a whole list to change them)."""
        return self._slots.prefill_tokens

    @prefill_tokens.setter
    def prefill_tokens(self, value: Sequence[int]) -> None:
        self._slots.prefill_tokens = list(value)

    @property
    def active_blocks(self) -> list[int]:
        """Per worker: prompt blocks of its requests not yet ended, from the slot manager (a new list: set a whole list to change them)."""
        return self._slots.active_blocks

    @active_blocks.setter
    def active_blocks(self, value: Sequence[int]) -> None:
        self._slots.active_blocks = list(value)

    @property
    def _live(self) -> dict[int, list[int]]:
        """Request index -> [replica, prefill tokens still counted, blocks] (the slot manager's)."""
        return self._slots.live

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        """The rule as written (with finite parameters the instance's ``route`` is the slot manager's, which decides
        the same)."""
        bs = request.block_size
        prompt = request.prompt_tokens
        new_blocks = -(-prompt // bs)
        hashes, now = request.block_hashes, request.arrival_s
        slots = self._slots
        if hashes:
            overlaps = slots.overlaps(hashes, now)
        else:  # no block can match
            overlaps = [0] * self.num_replicas
        if self._compiled:
            chosen = self._pick(least_costs(self.prefill_tokens, self.active_blocks, overlaps if hashes else None,
                                            prompt, bs, new_blocks, self.prefill_load_scale, self.overlap_credit))
        else:
            chosen = self._pick_min(self._costs_scan(prompt, bs, new_blocks, overlaps))
        # uncached = max(0, prompt - overlap * bs) charged as prefill, new_blocks as decode; the blocks indexed.
        slots.take(request.index, chosen, overlaps[chosen], prompt, bs, new_blocks, hashes, now)
        return chosen

    def _costs_scan(self, prompt: int, bs: int, new_blocks: int, overlaps: Sequence[int]) -> list[float]:
        """Each worker's ``worker_logit``, one at a time (the rule as written; ``least_costs`` computes the same)."""
        prefill_tokens, active_blocks = self.prefill_tokens, self.active_blocks
        scale, credit = self.prefill_load_scale, self.overlap_credit
        costs = []
        for w in range(self.num_replicas):
            prefill = (prefill_tokens[w] + prompt) / bs
            decode = active_blocks[w] + new_blocks
            costs.append(scale * max(0.0, prefill - credit * overlaps[w]) + decode)
        return costs

    # The hooks through the router (the instance's are bound to the slot manager's methods, which hold the
    # bookkeeping: a request's prefill tokens uncharged at its first token, everything at its end).
    def on_first_token(self, index: int, replica: int, now: float) -> None:
        self._slots.first_token(index, replica, now)

    def on_complete(self, index: int, replica: int, now: float) -> None:
        self._slots.complete(index, replica, now)


@register_router
class SessionAffinity(Router):
    """A request with a session id goes where its session's key hashes on a consistent-hash ring of the replicas;
    one without goes to the replica with the fewest requests routed in the last ``qps_window_s`` (lowest QPS).
    Source: vLLM production-stack (src/vllm_router/routers/routing_logic.py ``SessionRouter``: uhashring's ring
    over the session header, lowest-QPS fallback; the request-stats window defaults to 60 s).  The ring here:
    ``vnodes`` md5 points per replica (uhashring's ketama-style ring; its own point layout is not reproduced)."""

    name = "session_affinity"
    needs_state = False
    params = {
        "qps_window_s": Param(60.0, 0.0, math.inf, low_open=True),
        "vnodes": Param(160, 1, 100_000, integer=True),
    }

    def __init__(self, num_replicas: int, seed: int = 0, **params: float) -> None:
        super().__init__(num_replicas, seed, **params)
        points = sorted((_md5_int(f"replica-{r}-{v}"), r) for r in range(num_replicas) for v in range(int(self.vnodes)))
        self._ring_keys = [p for p, _ in points]
        self._ring_replicas = [r for _, r in points]
        #: (time, replica) of each request routed in the window, oldest first (one queue for all replicas: a
        #: replica's own window is its entries, in the same order), and how many each replica has there.
        self._recent: deque[tuple[float, int]] = deque()
        self._counts = Loads([0] * num_replicas)

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        now = request.arrival_s
        recent, counts = self._recent, self._counts
        while recent and recent[0][0] <= now - self.qps_window_s:
            r = recent.popleft()[1]
            counts.set(r, counts.counts[r] - 1)
        if request.session_id is not None:
            i = bisect.bisect_left(self._ring_keys, _md5_int(str(request.session_id))) % len(self._ring_keys)
            chosen = self._ring_replicas[i]
        else:
            chosen = counts.first_least()  # the lowest count, the first of equals
        recent.append((now, chosen))
        counts.set(chosen, counts.counts[chosen] + 1)
        return chosen


def _md5_int(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "big")
