"""What a router sees: one arriving request, and each replica as a real router gets it.

Nothing here reaches into an engine.  The fleet fills these in at the arrival's time from what a router in front
of real engines would have by then: the request itself, its own dispatch and completion history, and the metrics
each engine last published (with a reporting lag where the real router polls them).  A router is handed one
:class:`ReplicaView` per replica in a sequence; ``sim.fleet.ReplicaViews`` (compiled with the fleet's loop, in
``sim.fleet._loop``, so that the fleet's own views can subclass it) is that sequence with the reads of every
replica at once that routers make.
"""

from __future__ import annotations

from typing import NamedTuple


class RequestView(NamedTuple):
    """The arriving request (a named tuple: cheap to make, read-only)."""

    #: Its row in the workload (and the request table).
    index: int
    arrival_s: float
    class_name: str
    prompt_tokens: int
    #: The block hashes of its leading full prompt blocks at the engine's ``block_size`` (chained: a hash names its
    #: block and everything before it, as the engine's prefix cache keys them), from the trace's ``hash_ids``;
    #: empty when the trace has none or prefix caching is off.
    block_hashes: tuple[int, ...]
    #: Tokens per block hash (the engine's block size).
    block_size: int
    #: The trace's ``session_id`` (or ``conversation_id``) column, if it has one; else None.
    session_id: object | None = None


class ReplicaView(NamedTuple):
    """One replica as the router sees it when the request arrives (a named tuple: cheap to make, read-only).

    ``outstanding`` and ``routed`` are the router's own bookkeeping (requests it sent there, less those whose
    response has ended by now), exact at the arrival.  ``num_waiting``, ``num_running`` and ``kv_usage`` are the
    engine's published metrics (vLLM's ``num_requests_waiting``, ``num_requests_running``,
    ``kv_cache_usage_perc``): the state at the last step boundary at or before ``now - metrics_lag_s``, as
    vLLM's stats give it (waiting: the requests the schedule() before that boundary left waiting; arrivals during
    the step count from the next boundary on, ``sim.run_loop.EngineLoop.advance``).  For a
    router routed ahead of the run (``Router.needs_state`` false) they are None.
    """

    index: int
    routed: int
    outstanding: int | None = None
    num_waiting: int | None = None
    num_running: int | None = None
    #: GPU KV blocks held by requests over all GPU KV blocks (cached, unreferenced blocks count as free).
    kv_usage: float | None = None

    @property
    def queue_len(self) -> int | None:
        """Waiting plus running, as published."""
        if self.num_waiting is None or self.num_running is None:
            return None
        return self.num_waiting + self.num_running
