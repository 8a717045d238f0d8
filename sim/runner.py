"""The SimPy run loop: an arrival process feeds the engine process, which steps until every request ended.

Two generator processes and no global state: ``_arrivals`` adds each request at its arrival time and wakes an
idle engine; ``_engine`` expires client deadlines at step boundaries, asks the core for a step (or a run of
identical decode steps that ends before the next arrival or deadline), and holds the clock for its duration.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.engine.config import EngineConfig
from sim.engine.build import EnginePlan, build_engine, resolve_engine
from sim.engine.request import Request, Status
from sim.engine.sizing import KVSizing
from sim.errors import ConfigError, EngineAborted
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from sim.tables import RequestLog, step_table
from sim.workload.workload import MOONCAKE_HASH_BLOCK_TOKENS, Workload  # noqa: F401 (512: importable from here too)


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
        decode_columns: bool = True,
    ):
        """``config``: an EngineConfig, or an :class:`~sim.engine.build.EnginePlan` (from ``resolve_engine``, for
        ``model`` and ``gpu``: then it is not resolved again, and ``latency`` / ``coefficients`` are the plan's).
        ``record_steps=False`` keeps no step table; ``step_sink`` then receives it in chunks (DataFrames of
        up to ``sim.engine.core.ROWS_CHUNK`` rows) as the run goes, e.g. ``objectives.StepTotals().add``.
        ``keep_requests=False`` drops each request's live state once it ended (its row is in the request
        table's arrays), so memory grows with the requests in the system, not with the workload; with
        ``True`` (the default) ``self.requests`` holds every request's final state.
        ``decode_columns=False`` keeps the running batch as Request objects only (the slow path the decode
        columns are checked against; see sim/engine/decode_columns.py)."""
        if isinstance(config, EnginePlan):
            if latency is not None or coefficients is not None:
                raise ValueError("Simulation: a plan has its latency model; give latency/coefficients to resolve_engine")
            plan = config
        else:
            plan = resolve_engine(config, model, gpu, latency=latency, coefficients=coefficients)
        resolved = plan.config
        predicted = (
            predicted_output_lengths(workload, resolved.admission_quantile)
            if resolved.admission_policy == "predicted" else None
        )
        built = build_engine(
            plan, model, gpu, predicted_output=predicted,
            record_steps=record_steps, batch_decode_runs=batch_decode_runs, observer=observer,
        )
        self.config, self.sizing, self.latency, self.core = built.config, built.sizing, built.latency, built.core
        if decode_columns:
            # Running requests' steady decodes may live as arrays (the core stops that under an observer).
            self.core.scheduler.use_decode_columns()
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
        self._load_columns(workload, seed)
        #: Requests created (at arrival) and not yet ended, by index; with ``keep_requests`` every request.
        self._live: dict[int, Request] = {}
        self.requests: list[Request] = self._all_requests() if keep_requests else []
        self._done = 0
        scheduler = self.core.scheduler
        if scheduler.pool.enable_caching and any(self._keys):
            scheduler.share_prefixes()
        self._deadlines: list[tuple[float, int]] = []
        self._next_arrival = 0
        self.env = simpy.Environment()
        self._wake: simpy.Event | None = None
        self._aborted: str | None = None

    def _load_columns(self, workload: Workload, seed: int) -> None:
        """The workload's columns as arrays (a request's live state is made from them when it arrives) and the
        request table's arrays."""
        df = workload.requests
        self._timeout_at, self._cancel_at = workload.client_deadlines(seed)
        self._priorities = workload.priorities()
        self._predicted = self.core.scheduler.predicted_output
        self._ids = df["request_id"].to_numpy()
        self._classes = df["class"].astype(str).to_numpy()
        self._arrivals_s = df["arrival_s"].to_numpy(dtype=float)
        self._prompts = df["prompt_tokens"].to_numpy(dtype=np.int64)
        self._outputs = df["output_tokens"].to_numpy(dtype=np.int64)
        #: All requests' prefix keys in one int64 array and where each request's start (None: not made).
        self._key_array: np.ndarray | None = None
        self._key_starts: list[int] = []
        self._keys = self._prefix_keys(df, self._prompts)
        self.log = RequestLog(self._ids, self._classes, self._arrivals_s, self._prompts, self._outputs)
        #: The columns of requests ``[_lists_start, _lists_start + LIST_CHUNK)`` as Python lists (see _request).
        self._lists: list[list] = []
        self._lists_start = -1

    def _request(self, i: int) -> Request:
        """Request ``i``'s live state (made once; with ``keep_requests`` all are made up front)."""
        req = self._live.get(i)
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
            req = self._live[i] = self._new_request(
                i, ids[j], classes[j], arrivals[j], prompts[j], outputs[j], priorities[j], timeout_at[j],
                cancel_at[j], self._keys[i])
        return req

    def _columns(self) -> tuple[np.ndarray, ...]:
        """The columns a request's live state is made from, in :meth:`_new_request`'s order."""
        return (self._ids, self._classes, self._arrivals_s, self._prompts, self._outputs, self._priorities,
                self._timeout_at, self._cancel_at)

    def _all_requests(self) -> list[Request]:
        """Every request's live state, made up front (``keep_requests``), from the columns as Python lists
        (indexing the numpy columns element by element, as :meth:`_request` does, costs more than the request)."""
        reqs = [self._new_request(i, *row)
                for i, row in enumerate(zip(*(c.tolist() for c in self._columns()), self._keys))]
        self._live.update(enumerate(reqs))
        return reqs

    def _new_request(self, i: int, request_id: int, cls: str, arrival_s: float, prompt: int, output: int,
                     priority: int, timeout_at: float, cancel_at: float, keys: tuple[int, ...]) -> Request:
        predicted = self._predicted
        req = Request(
            index=i, request_id=request_id, class_name=cls, arrival_s=arrival_s, prompt_tokens=prompt,
            output_tokens_target=output, max_model_len=self.config.max_model_len, priority=priority,
            predicted_output=predicted.get(cls, 0) if predicted else 0, timeout_at=timeout_at, cancel_at=cancel_at,
            prefix_keys=keys,
        )
        if keys and self._key_array is not None:
            start = self._key_starts[i]
            req.prefix_array = self._key_array[start:start + len(keys)]
        return req

    def _drain(self) -> None:
        """Ended requests: their rows go to the request table's arrays and their live state is dropped."""
        finished = self.core.scheduler.finished
        if not finished:
            return
        self.log.record_all(finished)
        if not self.keep_requests:
            live = self._live
            for req in finished:
                live.pop(req.index, None)
        self._done += len(finished)
        finished.clear()

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
        self._key_array, ends = found
        self._key_starts = [0, *ends[:-1]]
        return _key_tuples(*found)

    # ---- processes -------------------------------------------------------------------------------------
    def _arrivals(self, env: simpy.Environment):
        scheduler = self.core.scheduler
        arrivals = self._arrivals_s
        for i in range(len(arrivals)):
            delay = float(arrivals[i]) - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._next_arrival += 1
            req = self._request(i)
            scheduler.add_request(req, env.now)
            if req.deadline < math.inf:
                heapq.heappush(self._deadlines, (req.deadline, req.index))
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _next_event_s(self) -> float:
        arrivals = self._arrivals_s
        nxt = float(arrivals[self._next_arrival]) if self._next_arrival < len(arrivals) else math.inf
        if self._deadlines and self._deadlines[0][0] < nxt:
            nxt = self._deadlines[0][0]
        # An asynchronous load from the CPU tier landing makes its request schedulable.
        return min(nxt, self.core.scheduler.next_load_ready_s())

    def _next_deadline_s(self) -> float:
        return self._deadlines[0][0] if self._deadlines else math.inf

    def _expire_deadlines(self, now: float) -> None:
        scheduler = self.core.scheduler
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, index = heapq.heappop(self._deadlines)
            req = self._live.get(index)
            if req is None:
                continue  # it ended already
            status = Status.TIMED_OUT if req.timeout_at <= req.cancel_at else Status.CANCELLED
            scheduler.abort(req, status, deadline)

    def _engine(self, env: simpy.Environment):
        core = self.core
        scheduler = core.scheduler
        total = len(self._arrivals_s)
        wall0 = time.perf_counter()
        last_report = wall0
        # The engine keeps its own clock and hands control back to SimPy only when an arrival is due (or it
        # must sleep): deadlines are the engine's own, so steps between two arrivals need no SimPy event.
        clock = env.now
        arrivals = self._arrivals_s
        finished = scheduler.finished
        while self._done + len(finished) < total:
            if len(finished) > 256:
                self._drain()
            if env.now < clock and self._next_arrival < total and arrivals[self._next_arrival] <= clock:
                yield env.timeout(clock - env.now)
            now = clock
            if now > self.max_sim_time_s:
                break
            self._expire_deadlines(now)
            if self._done + len(finished) >= total:
                break  # the last requests ended by client deadline
            step = None
            if scheduler.has_unfinished():
                try:
                    step = core.begin_step(now, self._next_event_s(), self._next_deadline_s())
                except EngineAborted as exc:
                    self._aborted = str(exc)
                    break
            if step is None:
                # Idle (or stuck until an arrival or deadline frees something): sleep until the next event.
                if env.now < clock:
                    yield env.timeout(clock - env.now)
                nxt = self._next_event_s()
                if nxt == math.inf:
                    if self._next_arrival >= total:
                        self._aborted = self._aborted or "no request can make progress"
                        break
                self._wake = env.event()
                if nxt < math.inf:
                    yield self._wake | env.timeout(nxt - now)
                else:
                    yield self._wake
                self._wake = None
                clock = env.now
                continue
            clock = now + step.duration_s
            core.end_step(clock)
            if self.progress is not None:
                wall = time.perf_counter()
                if wall - last_report >= self.progress_every_s:
                    last_report = wall
                    self.progress(Progress(clock, self._done + len(finished), total, wall - wall0))

    # ---- run -------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        env = self.env
        env.process(self._arrivals(env))
        engine = env.process(self._engine(env))
        with FrozenHeap():
            env.run(until=engine)
        self.core.scheduler.sync_requests()  # requests still running: their state out of the decode columns
        # The engine may have run ahead of SimPy's clock after the last arrival.
        self.end_s = max(env.now, self.core.last_step_end)
        self._drain()
        unfinished = [req for req in self._live.values()
                      if req.status not in (Status.FINISHED, Status.TIMED_OUT, Status.CANCELLED, Status.REJECTED)]
        settle = self.core.scheduler.settle
        for req in unfinished:
            req.status = Status.UNFINISHED
            settle(req)
        self.log.record_all(unfinished)
        self.core.flush_rows()
        requests = self.log.table()
        steps = step_table(self.core.step_rows if self.core.record_steps else [])
        end = requests["end_s"].max() if len(requests) else 0.0
        start = requests["arrival_s"].min() if len(requests) else 0.0
        makespan = float(end - start) if end == end else float(self.end_s - start)
        return SimResult(
            requests=requests,
            steps=steps,
            config=self.config,
            sizing=self.sizing,
            makespan_s=makespan,
            wall_s=time.perf_counter() - wall0,
            num_iterations=self.core.num_iterations,
            aborted=self._aborted,
            info={
                "num_gpu_blocks": self.sizing.num_gpu_blocks,
                "num_cpu_blocks": self.sizing.num_cpu_blocks,
                "block_bytes": self.sizing.block_bytes,
                "model": self.model.name,
                "gpu": self.gpu.name,
            },
        )


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
