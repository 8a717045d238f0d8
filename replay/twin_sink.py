"""What one HTTP request to the twin waits on (:class:`TokenSink`): the engine (:mod:`replay.twin_engine`) fills
it, the server streams from it and the metrics (:mod:`replay.twin_metrics`) read it; it imports neither."""

from __future__ import annotations

import asyncio
import math

from sim.engine.request import Request, Status


class TokenSink:
    """What one HTTP request waits on: tokens generated so far, and the end."""

    __slots__ = ("req", "event", "tokens", "done", "status", "error", "in_engine", "aborted", "admissions",
                 "hit_tokens", "first_hit_tokens", "first_token_t", "last_token_t")

    def __init__(self, req: Request):
        self.req = req
        self.event = asyncio.Event()
        self.tokens = 0
        self.done = False
        self.status: Status | None = None
        self.error: str | None = None
        self.in_engine = False
        self.aborted = False
        # For /metrics (replay.twin_metrics.TwinStats): admissions seen, prefix-cache hits, token times.
        self.admissions = 0
        self.hit_tokens = 0
        self.first_hit_tokens = 0
        self.first_token_t = math.nan
        self.last_token_t = math.nan

    @property
    def finish_reason(self) -> str:
        if self.status == Status.FINISHED:
            return "length"
        return "abort"


__all__ = ["TokenSink"]
