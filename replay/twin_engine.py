"""The digital twin's engine: the simulator's EngineCore and scheduler, stepped online in wall-clock time.

Time: the engine keeps a virtual clock ``T`` in simulated seconds; wall time maps to it as
``sim(wall) = (wall - wall0) * speed``.  A step scheduled at ``T`` with duration ``d`` ends at ``T + d``: the
engine sleeps until ``sim(wall) >= T + d`` and then applies the step at exactly ``T + d``.  Timer slack does not
accumulate: if the engine wakes late the next step starts without sleeping, and the lag (``sim(now) - T``) is
exported.  The engine's decisions therefore follow the simulator's semantics exactly, given the arrival times:

- an arrival is stamped ``sim(now)`` when the HTTP request is read (or an earlier hint, see ``submit``) and
  joins the scheduler at the first step boundary at or after that time (the offline run loop adds requests at
  their arrival and the scheduler sees them at its next ``schedule()``); an idle engine wakes at the arrival;
- a client disconnect (timeout, cancel) is applied at the next step boundary: its blocks are freed there, as
  the offline loop expires deadlines at step boundaries;
- each step is one iteration (no batched decode runs: future arrivals are unknown online).

``slack_s`` (wall seconds) lets the virtual clock run that far behind the wall clock, so that a request whose
arrival hint (the client's intended send time) lies up to ``slack_s`` in the past still joins at the right
step; every response then leaves ``slack_s`` wall seconds late, which the twin exports
(``kvtune:twin_slack_seconds``) and the load generator takes off.  Default 0: arrivals stamped on receipt.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from dataclasses import dataclass

from sim.engine.config import EngineConfig
from sim.engine.build import build_engine
from sim.engine.core import EngineCore
from sim.engine.request import Request, Status
from sim.engine.sizing import KVSizing
from sim.errors import ConfigError, EngineAborted
from sim.latency import LatencyCoefficients, LatencyModel
from sim.profiles import GpuProfile, ModelProfile
from replay.twin_metrics import Histogram, TwinStats
from replay.twin_sink import TokenSink

log = logging.getLogger("kvtune.twin")

FINAL = (Status.FINISHED, Status.TIMED_OUT, Status.CANCELLED, Status.REJECTED, Status.UNFINISHED)


def build_core(
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    coefficients: LatencyCoefficients | None = None,
    latency: LatencyModel | None = None,
    predicted_output: dict[str, int] | None = None,
    record_steps: bool = False,
) -> tuple[EngineConfig, KVSizing, EngineCore]:
    """Resolved config, KV sizing and an EngineCore from ``sim.engine.build.build_engine`` (the builder the
    offline run loop uses), stepping one iteration at a time."""
    if config.admission_policy == "predicted" and not predicted_output:
        raise ConfigError(
            "admission_policy", "predicted admission needs per-class output predictions (twin: --predicted class=N)"
        )
    built = build_engine(
        config, model, gpu, latency=latency, coefficients=coefficients, predicted_output=predicted_output,
        record_steps=record_steps, batch_decode_runs=False,
    )
    config, sizing, core = built.config, built.sizing, built.core
    return config, sizing, core


@dataclass
class TwinCounters:
    """The twin's own counters (vLLM's metrics are ``TwinEngine.stats``, replay.twin_metrics.TwinStats)."""

    iterations: int = 0
    requests_received: int = 0
    busy_s: float = 0.0
    max_lag_s: float = 0.0
    lag_s: float = 0.0


class TwinEngine:
    """Drives an EngineCore online.  Create inside a running event loop, ``start()``, ``submit()`` requests,
    ``abort()`` them when their client goes away, ``close()`` at the end."""

    def __init__(
        self,
        config: EngineConfig,
        model: ModelProfile,
        gpu: GpuProfile,
        *,
        speed: float = 1.0,
        coefficients: LatencyCoefficients | None = None,
        predicted_output: dict[str, int] | None = None,
        slack_s: float = 0.0,
        clock=time.monotonic,
    ):
        if not speed > 0:
            raise ConfigError("speed", f"must be > 0, got {speed!r}")
        if not slack_s >= 0:
            raise ConfigError("slack_s", f"must be >= 0, got {slack_s!r}")
        self.model = model
        self.gpu = gpu
        self.config, self.sizing, self.core = build_core(
            config, model, gpu, coefficients=coefficients, predicted_output=predicted_output
        )
        self.scheduler = self.core.scheduler
        self.speed = float(speed)
        self.slack_s = float(slack_s)
        self.clock = clock
        self.wall0 = clock()
        self.now_s = 0.0  # the engine's virtual clock T
        self.counters = TwinCounters()
        #: What /metrics exports, with vLLM's semantics.
        self.stats = TwinStats(self.max_model_len, bool(self.config.enable_prefix_caching) and self.config.is_v1)
        self._sinks: dict[int, TokenSink] = {}
        self._pending: list[tuple[float, int, TokenSink]] = []  # arrivals not yet handed to the scheduler
        self._aborts: list[TokenSink] = []
        self._next_index = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self.dead: str | None = None
        #: Set when the engine dies (the server then shuts down, as vLLM's does when its engine core dies).
        self.died = asyncio.Event()

    # ---- clock ---------------------------------------------------------------------------------------
    def sim_now(self) -> float:
        """Simulated seconds since start, per the wall clock."""
        return (self.clock() - self.wall0) * self.speed

    # ---- requests ------------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return int(self.config.max_model_len)

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        class_name: str = "default",
        priority: int = 0,
        arrival_wall: float | None = None,
    ) -> TokenSink:
        """A new request arriving now (or at ``arrival_wall``, a ``clock()`` time up to ``slack_s`` in the past)."""
        if self.dead:
            raise EngineAborted(self.dead)
        now = self.sim_now()
        arrival = now
        if arrival_wall is not None:
            hinted = (arrival_wall - self.wall0) * self.speed
            # A hint from the past (at most a second of slack-free wall time) is honoured, but never before the
            # engine's clock: a request that comes later than the slack joins at the next step boundary.
            if now - max(self.slack_s, 1.0) * self.speed <= hinted <= now:
                arrival = max(hinted, self.now_s)
        index = self._next_index
        self._next_index += 1
        predicted = self.scheduler.predicted_output
        req = Request(
            index=index, request_id=index, class_name=class_name, arrival_s=arrival, prompt_tokens=int(prompt_tokens),
            output_tokens_target=int(max_tokens), max_model_len=self.max_model_len, priority=int(priority),
            predicted_output=predicted.get(class_name, 0) if predicted else 0,
        )
        sink = TokenSink(req)
        self._sinks[index] = sink
        heapq.heappush(self._pending, (arrival, index, sink))
        self.counters.requests_received += 1
        self._wake.set()
        return sink

    def abort(self, sink: TokenSink) -> None:
        """The client went away: free the request's blocks at the next step boundary."""
        if sink.done or sink.aborted:
            return
        sink.aborted = True
        self._aborts.append(sink)
        self._wake.set()

    # ---- gauges ----------------------------------------------------------------------------------------
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._pending)

    def num_swapped(self) -> int:
        return self.scheduler.num_swapped()

    def kv_usage(self) -> float:
        pool = self.scheduler.pool
        return pool.num_used / pool.num_blocks if pool.num_blocks else 0.0

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.wall0 = self.clock()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kvtune-twin-engine")

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        for sink in list(self._sinks.values()):
            self._end_sink(sink, Status.UNFINISHED, error="server shutting down")

    # ---- the loop --------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except EngineAborted as exc:
            self._die(f"engine aborted: {exc}")
        except Exception as exc:  # noqa: BLE001 - a twin bug must not hang clients
            log.exception("twin engine failed")
            self._die(f"engine failed: {exc!r}")

    def _die(self, reason: str) -> None:
        self.dead = reason
        self.died.set()
        log.error("%s", reason)
        for sink in list(self._sinks.values()):
            self._end_sink(sink, Status.UNFINISHED, error=reason)

    async def _loop(self) -> None:
        core = self.core
        scheduler = self.scheduler
        counters = self.counters
        speed = self.speed
        while not self._closed:
            now = self.now_s
            self._admit_pending(now)
            self._apply_aborts(now)
            self._drain_finished()
            step = core.begin_step(now, scheduler.next_load_ready_s()) if scheduler.has_unfinished() else None
            if step is None:
                await self._idle()
                continue
            end = now + step.duration_s
            # Sleep until the wall clock reaches the step's end (never letting timer slack accumulate).
            delay = (end / speed + self.wall0 + self.slack_s) - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                lag = -delay * speed
                counters.lag_s = lag
                if lag > counters.max_lag_s:
                    counters.max_lag_s = lag
                await asyncio.sleep(0)  # let the HTTP side run
            core.end_step(end)
            self.now_s = end
            counters.busy_s += step.duration_s
            self._emit(step.output, end)

    async def _idle(self) -> None:
        """Nothing to run: wait for the next pending arrival's time, or for a new request or abort."""
        self._wake.clear()
        if self._aborts:
            return
        loads = self.scheduler.next_load_ready_s()  # an asynchronous CPU-tier load landing (sim offload)
        if not self._pending and loads == math.inf:
            await self._wake.wait()
            return
        target = min(self._pending[0][0] if self._pending else math.inf, loads)
        delay = (target / self.speed + self.wall0 + self.slack_s) - self.clock()
        if delay > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
                return  # something new came in first: look again
            except asyncio.TimeoutError:
                pass
        # The engine was idle until the arrival: its clock jumps there, as the offline loop's does.
        self.now_s = max(self.now_s, target)

    def _admit_pending(self, now: float) -> None:
        pending = self._pending
        scheduler = self.scheduler
        while pending and pending[0][0] <= now:
            _, _, sink = heapq.heappop(pending)
            if sink.aborted:
                self._end_sink(sink, Status.CANCELLED)
                continue
            sink.in_engine = True
            scheduler.add_request(sink.req, sink.req.arrival_s)

    def _apply_aborts(self, now: float) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, []
        for sink in aborts:
            if sink.done or not sink.in_engine:
                continue  # not yet admitted: dropped when its arrival comes up
            self.scheduler.abort(sink.req, Status.CANCELLED, now)

    def _emit(self, out, end: float) -> None:
        self.counters.iterations += 1
        sinks = self._sinks
        self.stats.on_step(out, end, sinks)
        for req, _ in out.scheduled:
            sink = sinks.get(req.index)
            if sink is not None and req.num_output_tokens > sink.tokens:
                sink.tokens = req.num_output_tokens
                sink.event.set()
        self._drain_finished()

    def _drain_finished(self) -> None:
        finished = self.scheduler.finished
        if not finished:
            return
        self.scheduler.finished = []
        for req in finished:
            sink = self._sinks.get(req.index)
            if sink is not None:
                self._end_sink(sink, req.status)

    def _end_sink(self, sink: TokenSink, status: Status, error: str | None = None) -> None:
        if sink.done:
            return
        req = sink.req
        sink.done = True
        sink.status = status
        sink.error = error
        self._sinks.pop(req.index, None)
        self.stats.on_end(sink, sink.finish_reason, status in FINAL and sink.in_engine, self.now_s)
        sink.event.set()


__all__ = ["Histogram", "TokenSink", "TwinCounters", "TwinEngine", "build_core"]
