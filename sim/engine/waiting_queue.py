"""The waiting queue: requests not yet running (new, preempted, or back from a CPU load), in FCFS or priority order."""

from __future__ import annotations

import heapq
from collections import deque

from sim.engine.request import Request


class WaitingQueue:
    """FCFS deque, or a heap on ``(priority, arrival, index)`` for the priority policy (vLLM's
    ``create_request_queue``)."""

    def __init__(self, priority: bool):
        self.priority = priority
        self._deque: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.priority else len(self._deque)

    def __iter__(self):
        if self.priority:
            return iter(r for *_, r in sorted(self._heap, key=lambda e: e[:3]))
        return iter(self._deque)

    def add(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_s, req.index, req))
        else:
            self._deque.append(req)

    def prepend(self, req: Request) -> None:
        """Preempted requests go back to the front (the heap orders them by key anyway)."""
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_s, req.index, req))
        else:
            self._deque.appendleft(req)

    def peek(self) -> Request:
        return self._heap[0][3] if self.priority else self._deque[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3] if self.priority else self._deque.popleft()

    def remove(self, req: Request) -> None:
        if self.priority:
            self._heap = [e for e in self._heap if e[3] is not req]
            heapq.heapify(self._heap)
        else:
            self._deque.remove(req)
