"""The requests of a run (:class:`RequestStore`): the workload's columns as arrays, each request's prefix keys (the
block hashes of its leading full prompt blocks, from the trace's ``hash_ids``), the live state of the requests in
the system, made at arrival, and the request table's arrays.  One per run, shared by every engine of it (the single
engine's ``sim.runner.Simulation`` and a fleet's replicas, ``sim.fleet``)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from sim.engine.config import EngineConfig
from sim.engine.request import Request
from sim.errors import ConfigError
from sim.tables import RequestLog
from sim.workload.workload import Workload


#: Requests whose workload columns are made into Python lists at a time, as they arrive (``RequestStore.request``).
LIST_CHUNK = 65536


class RequestStore:
    """The workload's requests as a run makes them: the workload's columns as arrays, each request's prefix keys,
    the live state of requests that arrived and have not ended (made at arrival from the columns), and the request
    table's arrays (``log``).  One per run, shared by every engine of it (a fleet's replicas too); indexed by
    workload row.

    ``config`` is the resolved engine config (block size, prefix caching, ``max_model_len``); ``predicted_output``
    the predicted admission's per-class output length (``predicted_output_lengths``), or None."""

    def __init__(self, workload: Workload, config: EngineConfig, seed: int, hash_block_tokens: int,
                 predicted_output: dict[str, int] | None, keep_requests: bool) -> None:
        self.config = config
        self.hash_block_tokens = hash_block_tokens
        #: With False, a request's live state is dropped once it ended (its row is in ``log``'s arrays).
        self.keep_requests = keep_requests
        df = workload.requests
        self.timeout_at, self.cancel_at = workload.client_deadlines(seed)
        self.priorities = workload.priorities()
        self.predicted = predicted_output
        self.ids = df["request_id"].to_numpy()
        # One str object per class, not per request (a million requests' own copies took ~60 MB; issue 34).
        codes, names = pd.factorize(df["class"].astype(str))
        self.classes = np.asarray(names, dtype=object)[codes]
        self.arrivals_s = df["arrival_s"].to_numpy(dtype=float)
        self.prompts = df["prompt_tokens"].to_numpy(dtype=np.int64)
        self.outputs = df["output_tokens"].to_numpy(dtype=np.int64)
        #: Per request, the block hashes of its leading full prompt blocks (empty: it shares nothing); and how many
        #: of them its ``Request.prefix_keys`` keeps (``pool_lengths``; None: all).
        self.keys, self.pool_lengths = self._prefix_keys(df, self.prompts)
        self.log = RequestLog(self.ids, self.classes, self.arrivals_s, self.prompts, self.outputs)
        #: The columns of requests ``[_lists_start, _lists_start + LIST_CHUNK)`` as Python lists (see request).
        self._lists: list[list] = []
        self._lists_start = -1
        #: Requests created (at arrival) and not yet ended, by index; with ``keep_requests`` every request.
        self.live: dict[int, Request] = {}
        #: With ``keep_requests``, every request's live state (made up front), in workload order; else empty.
        self.requests: list[Request] = self._all_requests() if keep_requests else []

    def __len__(self) -> int:
        return len(self.arrivals_s)

    def request(self, i: int) -> Request:
        """Request ``i``'s live state (made once; with ``keep_requests`` all are made up front)."""
        req = self.live.get(i)
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
            req = self.live[i] = self._new_request(
                i, ids[j], classes[j], arrivals[j], prompts[j], outputs[j], priorities[j], timeout_at[j],
                cancel_at[j], self._pool_keys(i))
        return req

    def record(self, finished: list[Request]) -> None:
        """Ended requests: their rows go to the request table's arrays, their live state is dropped (unless
        ``keep_requests``), and ``finished`` is emptied."""
        self.log.record_all(finished)
        if not self.keep_requests:
            live = self.live
            for req in finished:
                live.pop(req.index, None)
        finished.clear()

    def _columns(self) -> tuple[np.ndarray, ...]:
        """The columns a request's live state is made from, in :meth:`_new_request`'s order."""
        return (self.ids, self.classes, self.arrivals_s, self.prompts, self.outputs, self.priorities,
                self.timeout_at, self.cancel_at)

    def _all_requests(self) -> list[Request]:
        """Every request's live state, made up front (``keep_requests``), from the columns as Python lists
        (indexing the numpy columns element by element, as :meth:`request` does, costs more than the request)."""
        keys = [self._pool_keys(i) for i in range(len(self))]
        reqs = [self._new_request(i, *row)
                for i, row in enumerate(zip(*(c.tolist() for c in self._columns()), keys))]
        self.live.update(enumerate(reqs))
        return reqs

    def _pool_keys(self, i: int) -> tuple[int, ...]:
        """Request ``i``'s ``Request.prefix_keys``: its keys up to ``pool_lengths[i]``."""
        keys = self.keys[i]
        lengths = self.pool_lengths
        if lengths is not None and lengths[i] < len(keys):
            return keys[:lengths[i]]
        return keys

    def _new_request(self, i: int, request_id: int, cls: str, arrival_s: float, prompt: int, output: int,
                     priority: int, timeout_at: float, cancel_at: float, keys: tuple[int, ...]) -> Request:
        predicted = self.predicted
        req = Request(
            index=i, request_id=request_id, class_name=cls, arrival_s=arrival_s, prompt_tokens=prompt,
            output_tokens_target=output, max_model_len=cast(int, self.config.max_model_len), priority=priority,
            predicted_output=predicted.get(cls, 0) if predicted else 0, timeout_at=timeout_at, cancel_at=cancel_at,
            prefix_keys=keys,
        )
        return req

    def _prefix_keys(self, df: pd.DataFrame, prompts: np.ndarray) -> tuple[list[tuple[int, ...]], list[int] | None]:
        """Per request, the block hashes of its leading full prompt blocks from the trace's ``hash_ids`` (each id
        names one ``hash_block_tokens`` block of the prompt and, chained, everything before it, as in Mooncake's
        traces): kvtune block ``i`` gets key ``hash_id * (H / block_size) + offset``, and hash ``2 * key`` (even:
        see :func:`~sim.engine.prefix_pool.block_hash`).  Requests without ids share nothing.

        Also, per request, how many of those keys its ``Request.prefix_keys`` keeps (None: all, for every request):
        see :func:`pool_lengths`.  The routers of a fleet see every key (``keys``)."""
        if "hash_ids" not in df.columns or not self.config.enable_prefix_caching:
            return [()] * len(df), None
        block_size = self.config.block_size
        if self.hash_block_tokens // block_size < 1 or self.hash_block_tokens % block_size:
            raise ConfigError("block_size", f"{block_size} does not divide the trace's hash block of "
                                            f"{self.hash_block_tokens} tokens; shared prefixes cannot be mapped")
        column = df["hash_ids"].to_numpy()
        found = _prefix_hash_array(column, prompts, block_size, self.hash_block_tokens)
        if found is None:  # (ids that are not all int64: every key kept)
            return _int64_keys(_prefix_hashes_loop(column, prompts, block_size, self.hash_block_tokens)), None
        hashes, ends, pool = found
        return _key_tuples(hashes, ends), pool


def pool_lengths(ids: np.ndarray, id_counts: np.ndarray, num_blocks: np.ndarray, per_hash: int) -> list[int] | None:
    """Per request, how many of its keys its ``Request.prefix_keys`` keeps: those up to the end of its last hash id
    that the workload has more than once (in another request, or twice in its own); None where that is every key of
    every request.  A key past it belongs to one block of this request alone (a key is its id and the block's offset
    in it).  The prefix pool treats such blocks as a request's own blocks past its keys (``sim.engine.prefix_pool``:
    named, not mapped, while it holds them; one free-queue entry once it ended): nobody else can hit them and it
    does not look itself up while it holds them, so the pool decides the same with those keys or its own
    (tests/sim/engine/test_prefix_pool.py checks it on whole runs) and does less per block.  Counted per id rather
    than per key (32 blocks of 16 tokens to a 512-token id), an id's blocks count as shared when the id is, even
    those only one request's prompt reaches: keeping a key is always right, only dropping one needs it unique.

    ``ids``: every request's hash ids, request after request; ``id_counts``: how many each request has;
    ``num_blocks``: how many keys each has (its full prompt blocks covered by its ids); ``per_hash``: blocks per id."""
    if not len(ids):
        return None
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts[inverse] > 1)  # positions in ids of ids that occur more than once
    ends = np.cumsum(id_counts)
    starts = ends - id_counts
    last = np.full(len(ends), -1, dtype=np.int64)
    if len(shared):
        at = np.searchsorted(shared, ends) - 1  # each request's last shared position, if it lies in its range
        last = np.where(at >= 0, shared[np.maximum(at, 0)], -1)
    lengths = np.minimum(np.where(last >= starts, last - starts + 1, 0) * per_hash, num_blocks)
    if (lengths == num_blocks).all():
        return None
    return lengths.tolist()


def _prefix_hashes_loop(column: np.ndarray, prompts: np.ndarray, block_size: int,
                        hash_block_tokens: int) -> list[tuple[int, ...]]:
    """``RequestStore._prefix_keys`` request by request (the reference for :func:`_prefix_hashes`)."""
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
                       hash_block_tokens: int) -> tuple[np.ndarray, list[int], list[int] | None] | None:
    """:func:`_prefix_hashes_loop` in one numpy pass over all requests, as all requests' keys in one int64 array,
    where each request's end and :func:`pool_lengths`; or ``None`` where it might differ: ids that are not all int64
    (floats, or ints beyond int64) or so large that the hashes could overflow int64."""
    per_hash = hash_block_tokens // block_size
    rows = [() if ids is None else ids for ids in column]
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    flat = np.array([i for ids in rows for i in ids])
    if not len(flat):
        return np.zeros(0, dtype=np.int64), [0] * len(rows), None
    limit = (1 << 62) // per_hash - 1  # |id| <= limit: |2 * (id * per_hash + offset)| < 2**63
    if flat.dtype.kind != "i" or flat.min() < -limit or flat.max() > limit:
        return None
    num_blocks = np.where(lengths > 0, np.minimum(lengths * hash_block_tokens, prompts) // block_size, 0)
    ends = np.cumsum(num_blocks)
    block = np.arange(int(ends[-1])) - np.repeat(ends - num_blocks, num_blocks)  # i within its request
    first_id = np.repeat(np.cumsum(lengths) - lengths, num_blocks)  # where the request's ids start in flat
    hashes = (flat[first_id + block // per_hash] * per_hash + block % per_hash) << 1
    return hashes.astype(np.int64, copy=False), ends.tolist(), pool_lengths(flat, lengths, num_blocks, per_hash)


def _key_tuples(hashes: np.ndarray, ends: list[int]) -> list[tuple[int, ...]]:
    """:func:`_prefix_hash_array`'s keys as one tuple per request (:func:`_prefix_hashes_loop`'s form)."""
    flat = hashes.tolist()
    return [tuple(flat[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
