"""The running batch's steady decodes as numpy columns, so that a step updates them in one compiled pass.

A large batch (V1, or V0 without chunked prefill) is mostly requests that decode one token per step, step after
step.  Their per-step bookkeeping (computed tokens, inter-token gaps, time shares, finishing) is the same
arithmetic for each of them, so :class:`DecodeColumns` keeps it as arrays for the leading requests of the
running list (the *segment*): ``scheduler.running[:len(columns)]`` are exactly ``columns.requests``, in order.

While a request is in the segment the arrays are its state and these ``Request`` attributes are stale:
``num_computed_tokens``, ``high_water``, ``appended_tokens``, ``num_output_tokens``, ``processed_tokens``,
``blocks``, ``kv_blocks_peak``, ``last_token_s``, ``max_itl_s``, ``time_decode_s``, ``time_overhead_s``.  A
request joins only in a steady decode state, where most of them follow from its computed tokens ``c``
between steps: ``num_output = c + 1 - prompt``, ``high_water = appended = c``, ``blocks = ceil(c / B)``,
``processed = c + const``, ``kv_blocks_peak = max(at join, blocks)``.  :meth:`sync` writes them back; the
scheduler calls it for a request that leaves the segment (finished, aborted, preempted) and for the rest of the
segment before anything else reads them (a segment over the token budget, a segment too small to pay, the end
of the run).

No stale value can be read.  Joining writes :data:`STALE_INT` / :data:`STALE_FLOAT` into those attributes (a
reader that skips the sync gets an unmistakable value, not a plausible old one: the compared tables of
tests/sim/engine/test_compiled_engine.py and test_decode_columns.py would show it), and the code outside the
engine reads them only through one of the sync points: ``BaseScheduler.sync_requests()`` between steps (the
run loop at the end, or anyone else, at the cost of the segment joining again), and the engine's hooks, which
are called with the segment written back and marked stale again after the call (:meth:`poison`):
``EngineCore.step_hook`` between steps, ``EngineCore.schedule_hook`` after ``schedule()`` (:meth:`sync` with
``scheduled``: the block of the step's token is allocated then), ``BaseScheduler.abort_hook`` (the request is
written back and leaves the columns first); an observer stops the columns.  In the middle of a step the
object path itself counts a scheduled decode's ``processed_tokens`` (and V0's ``appended_tokens``) at schedule
time or at the update, as its fast path or general loop took it; between steps every attribute is exact.
tests/sim/engine/test_stale_state.py reads every attribute of every live request at every step, through the
hooks, against the object path in the pure-Python engine.
The per-step passes are compiled (``sim/engine/_column_kernels.py``).  The slow path, the same updates on
``Request`` objects one by one, is ``BaseScheduler.update_from_output``'s loops; benchmarks/tools/compare_tables.py
and tests/sim/engine/test_decode_columns.py check the two give identical tables, and
tests/sim/engine/test_column_kernels.py checks each kernel against numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.engine.request import Request

#: Rows of the integer and the float matrix (one column per segment request, in running order).
_INT = ("computed", "final", "prompt", "proc_off", "kv_join", "index")
_FLOAT = ("last_token", "max_itl", "time_decode", "time_overhead")
_C, _FINAL, _PROMPT, _PROC, _KV, _INDEX = range(6)
_LT, _ITL, _TD, _TO = range(4)
#: What a segment request's stale attributes hold while the arrays are its state (see the module docstring).
STALE_INT = -(1 << 40)
STALE_FLOAT = -float("inf")
#: Those attributes.
STALE_ATTRIBUTES = ("num_computed_tokens", "high_water", "appended_tokens", "num_output_tokens", "processed_tokens",
                    "blocks", "kv_blocks_peak", "last_token_s", "max_itl_s", "time_decode_s", "time_overhead_s")


class DecodeColumns:
    """Columns of the segment; ``final`` = computed tokens at which a request has produced its last output.

    Two matrices with spare capacity (rows above), so that joining writes into free columns and leaving
    compacts them in one operation each."""

    __slots__ = ("block_size", "requests", "entries", "ints", "floats", "_positions", "_k")

    def __init__(self, block_size: int, capacity: int = 256):
        self.block_size = block_size
        self.requests: list[Request] = []
        #: ``(request, 1)`` for each of ``requests``: the segment's entries of a step's ``SchedulerOutput.scheduled``,
        #: kept from step to step instead of made anew each step (a list of ~150 tuples).
        self.entries: list[tuple[Request, int]] = []
        self.ints = np.zeros((len(_INT), capacity), dtype=np.int64)
        self.floats = np.zeros((len(_FLOAT), capacity), dtype=np.float64)
        self._positions = np.zeros(capacity, dtype=np.int64)  # the kernels' output positions
        self._k: Any = None  # sim.engine._column_kernels, imported when the first request joins (numba loads then)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def computed(self) -> np.ndarray:
        return self.ints[_C, :len(self.requests)]

    @property
    def final(self) -> np.ndarray:
        return self.ints[_FINAL, :len(self.requests)]

    @property
    def index(self) -> np.ndarray:
        """The requests' ``Request.index`` (their keys in the KV tiers)."""
        return self.ints[_INDEX, :len(self.requests)]

    # ---- joining and leaving ---------------------------------------------------------------------------
    def join(self, reqs: list[Request]) -> None:
        """Append requests in a steady decode state (checked by the caller: one token to compute, computed >=
        prompt == high_water, blocks == ceil(computed / B), no stall) at the segment's end."""
        if self._k is None:
            self._k = _kernels()
        n, k = len(self.requests), len(reqs)
        if n + k > self.ints.shape[1]:
            capacity = max(2 * self.ints.shape[1], n + k)
            ints = np.zeros((len(_INT), capacity), dtype=np.int64)
            floats = np.zeros((len(_FLOAT), capacity), dtype=np.float64)
            ints[:, :n] = self.ints[:, :n]
            floats[:, :n] = self.floats[:, :n]
            self.ints, self.floats = ints, floats
            self._positions = np.zeros(capacity, dtype=np.int64)
        self.requests.extend(reqs)
        self.entries.extend([(r, 1) for r in reqs])
        ints = [(r.num_computed_tokens, r.max_output + r.prompt_tokens - 1, r.prompt_tokens,
                 r.processed_tokens - r.num_computed_tokens, r.kv_blocks_peak, r.index) for r in reqs]
        floats = [(r.last_token_s, r.max_itl_s, r.time_decode_s, r.time_overhead_s) for r in reqs]
        if k <= 8:  # a few: column by column (cheaper than building a matrix)
            for j in range(k):
                self.ints[:, n + j] = ints[j]
                self.floats[:, n + j] = floats[j]
        else:
            self.ints[:, n:n + k] = np.array(ints, dtype=np.int64).T
            self.floats[:, n:n + k] = np.array(floats, dtype=np.float64).T
        _poison(reqs)

    def poison(self) -> None:
        """Mark the segment's stale attributes again (after a hook read them written back)."""
        _poison(self.requests)

    def sync(self, positions=None, scheduled: int = 0) -> None:
        """Write the arrays back to the requests at ``positions`` (all when ``None``), between steps; or, for
        the first ``scheduled`` positions, in the middle of a step that scheduled them (after ``schedule()``,
        before the update): the block for their next token is allocated then (``blocks = ceil((c + 1) / B)``),
        as on the object path."""
        n = len(self.requests)
        block_size = self.block_size
        reqs = self.requests
        if positions is None:
            positions = range(n)
        if len(positions) > 8:
            ints = self.ints[:, :n].T.tolist()  # one (computed, final, prompt, proc_off, kv_join, index) per request
            floats = self.floats[:, :n].T.tolist()
        else:  # a few: their columns only
            ints = {i: self.ints[:, i].tolist() for i in positions}
            floats = {i: self.floats[:, i].tolist() for i in positions}
        for i in positions:
            req = reqs[i]
            c, _, prompt, proc_off, peak, _ = ints[i]
            req.num_computed_tokens = req.high_water = req.appended_tokens = c
            req.num_output_tokens = c + 1 - prompt
            req.processed_tokens = c + proc_off
            blocks = -(-c // block_size)
            req.kv_blocks_peak = blocks if blocks > peak else peak
            req.blocks = -(-(c + 1) // block_size) if i < scheduled else blocks
            req.last_token_s, req.max_itl_s, req.time_decode_s, req.time_overhead_s = floats[i]

    def token_marks(self, req: Request) -> tuple[float, float] | None:
        """``(last_token_s, max_itl_s)`` of ``req`` as the arrays hold them (None: not in the segment)."""
        for i, r in enumerate(self.requests):
            if r is req:
                return float(self.floats[_LT, i]), float(self.floats[_ITL, i])
        return None

    def drop(self, positions: list[int] | None) -> None:
        """Take the requests at ``positions`` (ascending) out of the segment (``None``: all of them)."""
        if positions is None:
            self.requests = []
            self.entries = []
            return
        n = len(self.requests)
        reqs, entries = self.requests, self.entries
        for i in reversed(positions):
            del reqs[i]
            del entries[i]
        k = len(positions)
        self._positions[:k] = positions
        self._k.compact(self.ints, self.floats, n, self._positions, k)

    def truncate(self, keep: int) -> None:
        """Write back the requests after the first ``keep`` and take them out of the segment."""
        n = len(self.requests)
        if keep < n:
            self.sync(range(keep, n))
            del self.requests[keep:]
            del self.entries[keep:]

    # ---- one step --------------------------------------------------------------------------------------
    def scan(self, free: int, limit: int, touch_one: bool = False) -> tuple[int, int, int, int]:
        """``(fit, need, context, min_remaining)``: how many leading requests the general loop would schedule
        without preempting (the longest prefix, at most ``limit`` long, whose blocks, one per request at a
        block boundary, fit ``free``; with ``touch_one``, V0's rule: while a free block is left after the
        blocks of the requests before), the blocks they need, their decode context and fewest remaining
        outputs."""
        return self._k.scan(self.ints, len(self.requests), self.block_size, free, limit, touch_one)

    def filling(self) -> np.ndarray:
        """Positions whose next token fills a block (hashed when the step's token is appended)."""
        k = self._k.filling(self.ints, len(self.requests), self.block_size, self._positions)
        return self._positions[:k]

    def advance(self, end_s: float, num_steps: int, first_end_s: float, last_gap_s: float,
                decode_share: float | None, overhead_share: float | None) -> tuple[int, np.ndarray | None]:
        """Apply ``num_steps`` decode steps (a single one: ``num_steps`` 1, gaps ``end_s - last token``) and return
        (blocks grown after the first step, positions that crossed into new full blocks, for hashing)."""
        shares = decode_share is not None
        grown, k = self._k.advance(self.ints, self.floats, len(self.requests), self.block_size, end_s, num_steps,
                                   first_end_s, last_gap_s, shares, decode_share if shares else 0.0,
                                   overhead_share if shares else 0.0, self._positions)
        return grown, (self._positions[:k].copy() if num_steps > 1 else None)

    def run_block_limit(self, rest_tokens: np.ndarray, free: int, limit: int) -> int:
        """Steps of a decode run (at most ``limit``) before the blocks of the segment and then of requests with
        ``rest_tokens`` tokens exceed ``free`` (``sim.engine.scheduler_base.block_limit``, in one compiled pass)."""
        return int(self._k.run_block_limit(self.ints, len(self.requests), rest_tokens, self.block_size, free, limit))

    def finished(self) -> list[int]:
        """Positions whose last output token came out, ascending."""
        k = self._k.finished(self.ints, len(self.requests), self._positions)
        return self._positions[:k].tolist() if k else []


def _poison(reqs: list[Request]) -> None:
    stale, nan = STALE_INT, STALE_FLOAT
    for req in reqs:
        req.num_computed_tokens = req.high_water = req.appended_tokens = req.num_output_tokens = stale
        req.processed_tokens = req.blocks = req.kv_blocks_peak = stale
        req.last_token_s = req.max_itl_s = req.time_decode_s = req.time_overhead_s = nan


#: Requests from which a run loads the column kernels in a process that has not (see :func:`worth_loading`).
COLD_MIN_REQUESTS = 100_000
_loaded: list[bool] = [False]  # the kernels were loaded in this process (join or warm_up)


def worth_loading(num_requests: int) -> bool:
    """Whether a run of ``num_requests`` should keep decode columns in this process.  Loading their kernels costs
    ~0.3 CPU s once per process (numba's first kernel sets up LLVM; benchmarks/speed/README.md, "Loading the
    kernels"), two to three times a 4,000-request incident run's simulation; the columns save 0-25% of a run's
    CPU.  So: yes where they are loaded already (a study's worker loads them at its warm-up, :func:`warm_up`), and
    from :data:`COLD_MIN_REQUESTS` requests.  Nothing else in the engine loads numba (the shared-prefix pool and
    the CPU tier are mypyc-compiled lists since issue 34)."""
    return _loaded[0] or num_requests >= COLD_MIN_REQUESTS


def _kernels():
    from sim.engine import _column_kernels

    _loaded[0] = True
    return _column_kernels


def warm_up() -> None:
    """Load the compiled kernels now (numba: ~1 s the first time in a process, compiling them once per machine),
    so that a timed or latency-bound run does not pay it: a study worker's warm-up and the benchmarks call it."""
    _kernels().warm_up()


__all__ = ["COLD_MIN_REQUESTS", "DecodeColumns", "STALE_ATTRIBUTES", "STALE_FLOAT", "STALE_INT", "warm_up",
           "worth_loading"]
