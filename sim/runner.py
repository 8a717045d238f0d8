"""The SimPy run loop: an arrival process feeds the engine process, which steps until every request ended.

Two generator processes and no global state: ``_arrivals`` adds each request at its arrival time and wakes an
idle engine; ``_engine`` expires client deadlines at step boundaries, asks the core for a step (or a run of
identical decode steps that ends before the next arrival or deadline), and holds the clock for its duration.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.engine.config import EngineConfig
from sim.engine.build import build_engine
from sim.engine.request import Request, Status
from sim.engine.sizing import KVSizing
from sim.errors import ConfigError, EngineAborted
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from sim.tables import request_table, step_table
from sim.workload.workload import Workload


#: Tokens per ``hash_ids`` entry in Mooncake's traces (FAST'25 artifact: one id per 512-token block).
MOONCAKE_HASH_BLOCK_TOKENS = 512


@dataclass
class SimResult:
    """The two tables of DESIGN section 3 and what the run needs to be explained."""

    requests: pd.DataFrame
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
        config: EngineConfig,
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
        hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS,
    ):
        resolved = config.resolve(model.max_model_len, gpu)
        predicted = (
            predicted_output_lengths(workload, resolved.admission_quantile)
            if resolved.admission_policy == "predicted" else None
        )
        built = build_engine(
            config, model, gpu, latency=latency, coefficients=coefficients, predicted_output=predicted,
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
        self.hash_block_tokens = hash_block_tokens
        self.requests = self._make_requests(workload, seed)
        scheduler = self.core.scheduler
        if scheduler.pool.enable_caching and any(r.prefix_keys for r in self.requests):
            scheduler.share_prefixes()
        self._deadlines: list[tuple[float, int]] = []
        self._next_arrival = 0
        self.env = simpy.Environment()
        self._wake: simpy.Event | None = None
        self._aborted: str | None = None

    def _make_requests(self, workload: Workload, seed: int) -> list[Request]:
        df = workload.requests
        timeout_at, cancel_at = workload.client_deadlines(seed)
        priorities = workload.priorities()
        predicted = self.core.scheduler.predicted_output
        max_len = self.config.max_model_len
        ids = df["request_id"].to_numpy()
        classes = df["class"].astype(str).to_numpy()
        arrivals = df["arrival_s"].to_numpy(dtype=float)
        prompts = df["prompt_tokens"].to_numpy(dtype=np.int64)
        outputs = df["output_tokens"].to_numpy(dtype=np.int64)
        keys = self._prefix_keys(df, prompts)
        return [
            Request(
                index=i, request_id=int(ids[i]), class_name=classes[i], arrival_s=float(arrivals[i]),
                prompt_tokens=int(prompts[i]), output_tokens_target=int(outputs[i]), max_model_len=max_len,
                priority=int(priorities[i]), predicted_output=predicted.get(classes[i], 0) if predicted else 0,
                timeout_at=float(timeout_at[i]), cancel_at=float(cancel_at[i]), prefix_keys=keys[i],
            )
            for i in range(len(df))
        ]

    def _prefix_keys(self, df: pd.DataFrame, prompts: np.ndarray) -> list[tuple[int, ...]]:
        """Per request, keys of its leading full prompt blocks from the trace's ``hash_ids`` (each id names one
        ``hash_block_tokens`` block of the prompt and, chained, everything before it, as in Mooncake's traces):
        kvtune block ``i`` gets key ``hash_id * (H / block_size) + offset``.  Requests without ids share nothing."""
        empty: tuple[int, ...] = ()
        if "hash_ids" not in df.columns or not self.config.enable_prefix_caching:
            return [empty] * len(df)
        block_size = self.config.block_size
        per_hash = self.hash_block_tokens // block_size
        if per_hash < 1 or self.hash_block_tokens % block_size:
            raise ConfigError("block_size", f"{block_size} does not divide the trace's hash block of "
                                            f"{self.hash_block_tokens} tokens; shared prefixes cannot be mapped")
        keys = []
        for ids, prompt in zip(df["hash_ids"].to_numpy(), prompts):
            if ids is None or len(ids) == 0:
                keys.append(empty)
                continue
            num_blocks = min(len(ids) * self.hash_block_tokens, int(prompt)) // block_size
            keys.append(tuple(int(ids[i // per_hash]) * per_hash + i % per_hash for i in range(num_blocks)))
        return keys

    # ---- processes -------------------------------------------------------------------------------------
    def _arrivals(self, env: simpy.Environment):
        scheduler = self.core.scheduler
        for req in self.requests:
            delay = req.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._next_arrival += 1
            scheduler.add_request(req, env.now)
            if req.deadline < math.inf:
                heapq.heappush(self._deadlines, (req.deadline, req.index))
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _next_event_s(self) -> float:
        nxt = self.requests[self._next_arrival].arrival_s if self._next_arrival < len(self.requests) else math.inf
        if self._deadlines and self._deadlines[0][0] < nxt:
            nxt = self._deadlines[0][0]
        # An asynchronous load from the CPU tier landing makes its request schedulable.
        return min(nxt, self.core.scheduler.next_load_ready_s())

    def _expire_deadlines(self, now: float) -> None:
        scheduler = self.core.scheduler
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, index = heapq.heappop(self._deadlines)
            req = self.requests[index]
            status = Status.TIMED_OUT if req.timeout_at <= req.cancel_at else Status.CANCELLED
            scheduler.abort(req, status, deadline)

    def _engine(self, env: simpy.Environment):
        core = self.core
        scheduler = core.scheduler
        total = len(self.requests)
        wall0 = time.perf_counter()
        last_report = wall0
        # The engine keeps its own clock and hands control back to SimPy only when an arrival is due (or it
        # must sleep): deadlines are the engine's own, so steps between two arrivals need no SimPy event.
        clock = env.now
        requests = self.requests
        while len(scheduler.finished) < total:
            if env.now < clock and self._next_arrival < total and requests[self._next_arrival].arrival_s <= clock:
                yield env.timeout(clock - env.now)
            now = clock
            if now > self.max_sim_time_s:
                break
            self._expire_deadlines(now)
            if len(scheduler.finished) >= total:
                break  # the last requests ended by client deadline
            step = None
            if scheduler.has_unfinished():
                try:
                    step = core.begin_step(now, self._next_event_s())
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
                    self.progress(Progress(clock, len(scheduler.finished), total, wall - wall0))

    # ---- run -------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        env = self.env
        env.process(self._arrivals(env))
        engine = env.process(self._engine(env))
        env.run(until=engine)
        # The engine may have run ahead of SimPy's clock after the last arrival.
        self.end_s = max(env.now, self.core.last_step_end)
        for req in self.requests:
            if req.status not in (Status.FINISHED, Status.TIMED_OUT, Status.CANCELLED, Status.REJECTED):
                req.status = Status.UNFINISHED
        requests = request_table(self.requests)
        steps = step_table(self.core.step_rows)
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


def simulate(workload: Workload, config: EngineConfig, model: ModelProfile, gpu: GpuProfile, **kwargs) -> SimResult:
    """Run one simulation; keyword arguments go to :class:`Simulation`."""
    return Simulation(workload, config, model, gpu, **kwargs).run()
