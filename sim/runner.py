"""One simulated run of a workload on one engine (:class:`Simulation`, :func:`simulate`): an arrival process feeds
the engine process, which steps until every request ended.

Two generator processes and no global state: ``Simulation._arrivals`` adds each request at its arrival time and
wakes an idle engine; :meth:`~sim.run_loop.EngineLoop.process` expires client deadlines at step boundaries, asks the
core for a step (or a run of identical decode steps that ends before the next arrival or deadline), and holds the
clock for its duration.  The per-engine pieces are shared with ``sim.fleet`` (N engines behind a router on one
clock) and live in their own modules: the requests (:class:`~sim.request_store.RequestStore`) and the loop with its
per-engine state (:mod:`sim.run_loop`: :class:`EngineLoop`, :class:`Feed`, :class:`RunRecord`).  They stay
importable from here.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.engine.config import EngineConfig
from sim.engine.build import EnginePlan, build_engine, resolve_engine
from sim.engine.decode_columns import worth_loading
from sim.engine.request import Request
from sim.engine.sizing import KVSizing
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from sim.request_store import LIST_CHUNK, RequestStore  # noqa: F401 (LIST_CHUNK: importable from here too)
from sim.run_loop import EngineLoop, Feed, Progress, RunRecord, finish_run  # noqa: F401 (RunRecord: likewise)
from sim.tables import step_table
from sim.workload.workload import MOONCAKE_HASH_BLOCK_TOKENS, Workload  # noqa: F401 (512: importable from here too)

__all__ = ["EngineLoop", "Feed", "FrozenHeap", "Progress", "RequestStore", "RunRecord", "SimResult", "Simulation",
           "finish_run", "plan_for", "predicted_output_for", "predicted_output_lengths", "run_info", "simulate"]


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


def predicted_output_lengths(workload: Workload, quantile: float) -> dict[str, int]:
    """Per class, the ``quantile`` of its output length: what kvtune's predicted admission assumes.

    Taken from the workload itself, standing in for the operator's history of that class.
    """
    df = workload.requests
    out = {}
    for name, group in df.groupby("class", sort=False):
        out[str(name)] = int(np.ceil(np.quantile(group["output_tokens"].to_numpy(), quantile)))
    return out


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
            decode_columns = worth_loading(len(workload))
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


