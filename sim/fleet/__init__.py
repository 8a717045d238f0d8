"""A fleet of engine replicas behind a router, in one simulation.

N replicas of one engine config (each the V1/V0 engine of ``sim.engine``, with its own KV cache and prefix cache,
built from one ``sim.engine.build.resolve_engine`` plan: ``plan.build()`` per replica) share one clock behind a
router that places each arriving request on one of them::

    from sim.fleet import simulate_fleet
    result = simulate_fleet(workload, config, model, gpu, replicas=8, router="sglang_cache_aware",
                            router_params={"cache_threshold": 0.5}, seed=0)
    result.requests      # the request table (sim.tables) plus ``replica``: where each request went
    result.steps         # every replica's step table, with ``replica``
    result.replicas      # per replica: requests, load_share, finished, prompt_tokens, prefix_hit_tokens,
                         # prefix_hit_rate (prefix_hit_tokens over prompt tokens)
    result.fleet         # the same over the fleet, and max_load_ratio (busiest share over the even share)

``simulate_fleet(workload, config, model, gpu, *, replicas=1, router="round_robin", router_params=None, seed=0,
**kwargs)``: ``kwargs`` are :class:`FleetSimulation`'s (``latency``, ``coefficients``, ``record_steps``,
``max_sim_time_s``, ``batch_decode_runs``, ``hash_block_tokens``, ``keep_requests``, ``decode_columns``), as
``sim.runner.simulate`` takes them.  One replica behind any router gives exactly ``simulate``'s tables (plus ``replica`` = 0).

Routers (:func:`router_names`; parameters and ranges in each class's ``params``; :func:`make_router` checks them
and raises ``sim.errors.ConfigError`` naming ``router``, ``replicas`` or ``router_params.<name>``):

- ``round_robin``: request i to replica i mod N.
- ``least_outstanding``: fewest requests in flight from the router.
- ``least_kv_usage``: lowest published KV usage (llm-d's kv-cache-utilization scorer); ``metrics_lag_s``.
- ``sglang_cache_aware``: SGLang router's prefix-aware policy with its load-imbalance fallback
  (``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``).
- ``llm_d_weighted``: llm-d's prefix / KV-utilization / queue scorers with its Helm profile's weights 3/2/2.
- ``dynamo_kv``: Dynamo's KV-router cost (``prefill_load_scale``, ``overlap_credit``, ``ttl_s``).
- ``session_affinity``: a consistent-hash ring over the trace's ``session_id`` (or ``conversation_id``),
  lowest recent request rate for requests without one.

What a router sees (:class:`ReplicaView`): its own counts (``routed``; ``outstanding``: sent, response not ended
by the replica's last step boundary at or before the arrival) exactly, and each engine's metrics (``num_waiting``,
``num_running``, ``kv_usage``) as published at the last step boundary at or before the arrival less the router's
``metrics_lag_s``; never anything later.  A boundary inside a run of identical decode steps shows what stepping one
iteration at a time would have published (``sim.runner.RunRecord``: queue lengths constant but for arrivals
queued there, KV blocks grown by each step's new blocks).  A router with ``reads_metrics = False``
(``least_outstanding``, ``sglang_cache_aware``, ``dynamo_kv``) is shown no metrics (None).  Prefix routers keep
their own approximate index of the block hashes they sent where (no engine introspection).

Each replica is the single engine's own loop (``sim.runner.EngineLoop``, one copy for both) over one shared store
of the workload's requests (``sim.runner.RequestStore``).

Speed (``benchmarks/fleet_speed.py``; figures in benchmarks/speed/README.md, "Fleet speed"): no SimPy.  A router
that reads state is asked at each arrival: the arrivals in order, and before each only the replicas with a step
boundary, a run's end or a wake-up before it are advanced up to it (``EngineLoop.advance``, through a heap of when
each next acts); a replica with nothing due is not touched, and what the router reads of it is what it published
at its last boundary.  A busy replica's run of identical decode steps is not cut at arrivals routed elsewhere: it
is bounded by its own deadlines only, its end applied once no fleet arrival before it remains, and an arrival
routed to it ends it at that arrival (``EngineLoop.cut`` / ``EngineCore.cut_run``: the steps that start before the
arrival, exactly what the bound known in advance gives, so one replica still reproduces ``simulate``).  Views are
remade only for replicas whose counts changed; a router that reads metrics is given them on demand
(``sim.fleet._loop.MetricViews``), each replica's published figures read again only when it moved or the cutoff
reached its next recorded boundary, and inside a run of decode steps only where the router needs them
(``least_kv_usage``: where the replica could be the least); a ``tracks_requests`` router is told of first tokens and ends from the replicas that moved since the
last arrival only.  A router that reads no engine state (``round_robin``, ``session_affinity``:
``Router.needs_state = False``) is run ahead of the simulation; its replicas then do not interact, and each is
driven the same way at its own arrivals only, one replica after another over each stretch of 65,536 arrivals
(``sim.fleet._loop.run_routed``: an engine stays in the CPU's caches while it runs, where taking every arrival in
time order switched engines at each).

A replica that aborts (as vLLM aborts on a lack of swap space) stays behind the router; what is routed to it is
left unfinished.  The fleet has no progress callback and no streamed step sink yet.

A new router subclasses :class:`Router` (``route(request, replicas) -> int`` over a :class:`RequestView` and one
:class:`ReplicaView` per replica: only what a real router sees at the arrival) and registers with
:func:`register_router`.  ``replicas`` may be any sequence of views; :func:`replica_views` gives it as a
:class:`ReplicaViews`, whose ``least_usage()`` and ``published()`` read every replica at once (the fleet's own
views answer them from their columns, a plain sequence view by view, with the same result).
"""

from __future__ import annotations

from sim.fleet._fleet import FleetResult, FleetSimulation, replica_summary, simulate_fleet
from sim.fleet._loop import ReplicaViews, replica_views
from sim.fleet._routers import Param, Router, make_router, register_router, router_class, router_names
from sim.fleet._views import ReplicaView, RequestView

__all__ = [
    "FleetResult",
    "FleetSimulation",
    "Param",
    "ReplicaView",
    "ReplicaViews",
    "RequestView",
    "Router",
    "make_router",
    "register_router",
    "replica_summary",
    "replica_views",
    "router_class",
    "router_names",
    "simulate_fleet",
]
