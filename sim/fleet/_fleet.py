"""A fleet of engine replicas behind a router, on one clock."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from sim.engine.build import EnginePlan
from sim.engine.config import EngineConfig
from sim.engine.decode_columns import worth_loading
from sim.engine.request import Status
from sim.engine.sizing import KVSizing
from sim.errors import ConfigError
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from sim.request_store import LIST_CHUNK
from sim.runner import (EngineLoop, Feed, FrozenHeap, RequestStore, finish_run, plan_for,
                        predicted_output_for, run_info)
from sim.tables import step_table
from sim.workload.workload import Workload
from sim.fleet._loop import CountViews, Followed, RequestViews, preroute, route_all, run_routed
from sim.fleet._routers import Router, make_router
from sim.fleet._views import ReplicaView

#: Workload columns read as a request's session id, the first present.
SESSION_COLUMNS = ("session_id", "conversation_id")


@dataclass
class FleetResult:
    """The fleet's tables and its per-replica summaries."""

    #: One row per workload request (``sim.tables.REQUEST_COLUMNS`` and ``capped``) plus ``replica``: where the
    #: router sent it (-1: it never arrived, the run stopped first).
    requests: pd.DataFrame
    #: Every replica's step table, with a ``replica`` column (empty without ``record_steps``).
    steps: pd.DataFrame
    #: One row per replica: see :func:`replica_summary`.
    replicas: pd.DataFrame
    #: The same sums over the fleet.
    fleet: dict
    router: str
    router_params: dict
    config: EngineConfig
    sizing: KVSizing
    makespan_s: float
    wall_s: float
    #: Engine iterations, summed over the replicas.
    num_iterations: int
    #: The first replica's abort message, if any replica aborted.
    aborted: str | None = None
    info: dict = field(default_factory=dict)


def replica_summary(requests: pd.DataFrame, num_replicas: int) -> tuple[pd.DataFrame, dict]:
    """Per replica (and over the fleet): requests routed there, their share of the fleet's, how many finished,
    prompt tokens, prefix-cache hit tokens and the hit rate (``prefix_hit_tokens`` over prompt tokens)."""
    routed = requests[requests["replica"] >= 0]
    grouped = routed.groupby("replica")
    index = pd.RangeIndex(num_replicas, name="replica")
    out = pd.DataFrame({
        "requests": grouped.size().reindex(index, fill_value=0),
        "finished": grouped["status"].apply(lambda s: int((s == Status.FINISHED.value).sum())).reindex(index, fill_value=0),
        "prompt_tokens": grouped["prompt_tokens"].sum().reindex(index, fill_value=0),
        "prefix_hit_tokens": grouped["prefix_hit_tokens"].sum().reindex(index, fill_value=0),
    })
    total = int(out["requests"].sum())
    out["load_share"] = out["requests"] / total if total else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        out["prefix_hit_rate"] = np.where(out["prompt_tokens"] > 0, out["prefix_hit_tokens"] / out["prompt_tokens"], 0.0)
    prompt = int(out["prompt_tokens"].sum())
    hits = int(out["prefix_hit_tokens"].sum())
    fleet = {
        "replicas": num_replicas,
        "requests": total,
        "finished": int(out["finished"].sum()),
        "prompt_tokens": prompt,
        "prefix_hit_tokens": hits,
        "prefix_hit_rate": hits / prompt if prompt else 0.0,
        # The busiest replica's share over the even share (1: perfectly even).
        "max_load_ratio": float(out["load_share"].max() * num_replicas) if total else 0.0,
    }
    return out.reset_index(), fleet


class FleetSimulation:
    """N replicas of one engine config behind a router, sharing one clock."""

    def __init__(
        self,
        workload: Workload,
        config: EngineConfig | EnginePlan,
        model: ModelProfile,
        gpu: GpuProfile,
        replicas: int = 1,
        router: str | Router = "round_robin",
        router_params: Mapping[str, object] | None = None,
        latency: LatencyModel | None = None,
        coefficients: LatencyCoefficients | None = None,
        seed: int = 0,
        record_steps: bool = True,
        max_sim_time_s: float = math.inf,
        batch_decode_runs: bool = True,
        hash_block_tokens: int | None = None,
        keep_requests: bool = True,
        decode_columns: bool | None = None,
    ):
        """``decode_columns``: as :class:`~sim.runner.Simulation`'s (``None``: where they pay in this process,
        ``decode_columns.worth_loading`` of the whole workload), for every replica."""
        if isinstance(router, Router):
            self.router = router
            if router.num_replicas != replicas:
                raise ConfigError("replicas", f"{replicas} replicas but the router was made for {router.num_replicas}")
        else:
            self.router = make_router(router, router_params, replicas, seed)
        self.router_params = {k: getattr(self.router, k) for k in type(self.router).params}
        # One plan (config resolved, KV sized, latency model picked once), one engine built from it per replica, and
        # one store of the workload's requests (columns, prefix keys, live state, the request table's arrays).
        # Prompt tokens per hash_ids entry: the workload's own (its trace option) unless given, as Simulation.
        hash_block_tokens = workload.hash_block_tokens if hash_block_tokens is None else hash_block_tokens
        plan = self.plan = plan_for(config, model, gpu, latency, coefficients)
        predicted = predicted_output_for(workload, plan.config)
        cores = [plan.build(predicted_output=predicted, record_steps=record_steps,
                            batch_decode_runs=batch_decode_runs).core for _ in range(replicas)]
        self.config, self.sizing, self.model, self.gpu = plan.config, plan.sizing, model, gpu
        self.store = RequestStore(workload, plan.config, seed, hash_block_tokens, predicted, keep_requests)
        share = cores[0].scheduler.pool.enable_caching and any(self.store.keys)
        if decode_columns is None:
            decode_columns = worth_loading(len(workload))
        for core in cores:
            if decode_columns:
                core.scheduler.use_decode_columns()
            if share:
                core.scheduler.share_prefixes()
        self.arrivals_s = self.store.arrivals_s
        n = len(self.arrivals_s)
        self.replica_of = np.full(n, -1, dtype=np.int64)
        df = workload.requests
        column = next((c for c in SESSION_COLUMNS if c in df.columns), None)
        sessions = df[column].tolist() if column is not None else None
        # As plain Python values, made once (a request's view is made at each arrival).
        self._arrival_list = self.arrivals_s.tolist()
        self._requests = RequestViews(self._arrival_list, [str(c) for c in self.store.classes],
                                      self.store.prompts.tolist(), self.store.keys, self.config.block_size,
                                      None if sessions is None else [_session(v) for v in sessions])
        state = self.router.needs_state
        if state:
            # Decided at each arrival: every replica may receive any arrival (a shared feed), and each is advanced
            # to an arrival only when it has something due before it (EngineLoop.advance); a replica's run of
            # decode steps ends at an arrival only when it is routed there (EngineLoop.cut).
            feed = Feed(self.arrivals_s.tolist())
            feeds = [feed] * replicas
            self._feed: Feed | None = feed
        else:
            # Routed before the run: the replicas do not interact, and each runs through its own arrivals
            # (``sim.fleet._loop.run_routed``).
            feeds = [Feed(times) for times in self._preroute()]
            self._feed = None
        self.replicas = [EngineLoop(core, self.store, feeds[r], max_sim_time_s, own_feed=False, index=r)
                         for r, core in enumerate(cores)]
        #: Replicas whose published state changed since the router's views were last brought up to date.
        self._dirty: list[int] = list(range(replicas))
        self._view_list = [ReplicaView(index=r, routed=0, outstanding=0) for r in range(replicas)]
        self._reads_metrics = state and self.router.reads_metrics
        # A router that keeps its own index of the loads is told of each change instead of scanning the views.
        self._follow = state and not self._reads_metrics and self.router.follows_loads
        if self._follow:
            self.router.follow_loads(self._view_list)
        #: The views the router is handed at each arrival when it reads no engine metrics: the list kept up to date
        #: from the replicas' counts, or, for a router that says it does not read them (``reads_counts`` false),
        #: the same views made when read.
        self._views: Sequence[ReplicaView] = self._view_list
        on_demand = state and not self._reads_metrics and not self._follow and not self.router.reads_counts
        if on_demand:
            self._views = CountViews(self.replicas)
        if state:
            for rep in self.replicas:
                if not on_demand:  # (nothing kept to bring up to date)
                    rep.dirty = self._dirty
                if self._reads_metrics:
                    rep.keep_history()
        #: For a ``tracks_requests`` router: its requests' first tokens and ends as the engines report them.
        self._followed: Followed | None = None
        if state and self.router.tracks_requests:
            for rep in self.replicas:
                rep.scheduler.news = []
            self._followed = Followed([rep.scheduler.news for rep in self.replicas], n)
        #: Replicas that stepped (or were routed a request) since the router was last told of first tokens and ends
        #: (``Followed.notify``): only those can have news.  A replica's first tokens and ends come at its step
        #: ends, which it reaches (``advance``) only at or before the arrival that follows them, or when a request
        #: is routed there.
        self._moved: list[int] = []

    # ---- routing ---------------------------------------------------------------------------------------------
    def _preroute(self) -> list[list[float]]:
        """Every request routed before the run (``sim.fleet._loop.preroute``, compiled with the engine); returns
        each replica's arrival times."""
        self._replica_list, times = preroute(self.router, self._requests, self.router.num_replicas, self._check)
        self.replica_of[:] = self._replica_list
        return times

    def _check(self, chosen: object, i: int) -> int:
        if type(chosen) is int and 0 <= chosen < self.router.num_replicas:
            return chosen
        if isinstance(chosen, bool) or not isinstance(chosen, (int, np.integer)) or not 0 <= chosen < self.router.num_replicas:
            raise ValueError(f"router {self.router.name!r} returned {chosen!r} for request {i}; "
                             f"expected a replica index in [0, {self.router.num_replicas})")
        return int(chosen)

    # ---- the run loops ---------------------------------------------------------------------------------------
    def _route_all(self) -> float:
        """Routed at each arrival (``needs_state``): the arrivals in order, and before each every replica with a
        boundary, run end or wake-up at or before it advanced up to it (``EngineLoop.advance``), the rest left as
        they are (they have nothing due; what the router reads of them is as of their last boundary); then the
        router decides and the chosen replica gets the request (its pending run cut there).  No SimPy: the replicas
        are advanced in time order through a heap of when each next acts (``sim.fleet._loop.route_all``, compiled
        with the engine).  Returns the last arrival's time."""
        assert self._feed is not None
        router = self.router
        return route_all(self.replicas, self.store, self._feed, self._requests, router, self._check,
                         self.replica_of, self._views, self._reads_metrics, router.metrics_lag,
                         router.load_changed if self._follow else None, self._dirty,
                         self._followed, self._moved)

    # ---- run -------------------------------------------------------------------------------------------------
    def run(self) -> FleetResult:
        wall0 = time.perf_counter()
        with FrozenHeap():
            if self._feed is not None:
                now = self._route_all() if len(self._arrival_list) else 0.0
            else:
                now = run_routed(self.replicas, self.store, self._arrival_list, self._replica_list, LIST_CHUNK)
            for rep in self.replicas:
                if rep.idle:
                    rep.clock = now  # woken by the arrivals' end, to end (or to find itself stuck)
                rep.advance(math.inf)
                if not rep.stopped:
                    now = max(now, rep.clock)
        requests, makespan, _ = finish_run(self.replicas, self.store, now, self.replica_of)
        requests["replica"] = self.replica_of
        steps = []
        for rep in self.replicas:
            if rep.core.record_steps:
                table = step_table(rep.core.step_rows)
                table.insert(0, "replica", rep.index)
                steps.append(table)
        per_replica, fleet = replica_summary(requests, len(self.replicas))
        return FleetResult(
            requests=requests,
            steps=pd.concat(steps, ignore_index=True) if steps else step_table([]).assign(replica=np.int64(0)),
            replicas=per_replica,
            fleet=fleet,
            router=self.router.name,
            router_params=self.router_params,
            config=self.config,
            sizing=self.sizing,
            makespan_s=makespan,
            wall_s=time.perf_counter() - wall0,
            num_iterations=sum(rep.core.num_iterations for rep in self.replicas),
            aborted=next((rep.aborted for rep in self.replicas if rep.aborted), None),
            info={**run_info(self.sizing, self.model, self.gpu), "replicas": len(self.replicas)},
        )


def _session(value: object) -> object | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def simulate_fleet(workload: Workload, config: EngineConfig, model: ModelProfile, gpu: GpuProfile, *,
                   replicas: int = 1, router: str | Router = "round_robin",
                   router_params: Mapping[str, object] | None = None, seed: int = 0, **kwargs) -> FleetResult:
    """Run ``workload`` on ``replicas`` copies of ``config`` behind ``router``; other keyword arguments go to
    :class:`FleetSimulation`.  Set-up and run each in a :class:`~sim.runner.FrozenHeap`, as ``simulate``."""
    with FrozenHeap():
        fleet = FleetSimulation(workload, config, model, gpu, replicas=replicas, router=router,
                                router_params=router_params, seed=seed, **kwargs)
    return fleet.run()
