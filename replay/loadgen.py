"""Open-loop load generator: replays a workload against an OpenAI-compatible server with the trace's timing.

One asyncio task per request, started at the request's trace arrival time (divided by ``speed``) whatever the
server is doing, with no limit on open connections: a slow server makes requests wait inside the server, never
delays the next send (no coordinated omission).  Latencies are measured from the intended arrival time.

Each request streams ``/v1/completions`` with a prompt of exactly ``prompt_tokens`` token ids (random ids,
seeded by seed and request id, so requests share no prefix; a workload's ``hash_ids`` make the leading blocks
shared: identical ids, identical tokens), ``max_tokens`` = the trace's output length
(clipped to ``max_model_len - prompt``, which the simulator does as well) and ``ignore_eos``, asking for
per-chunk usage so that multi-token chunks are counted.  A class's client timeout and the workload's cancel
draws (``Workload.client_deadlines(seed)``, the same draws the simulator uses) close the stream at the
deadline; the row is then ``timed_out`` / ``cancelled`` with ``end_s`` at the deadline.  Its tokens are those read
by then, plus those the connection had delivered when a late deadline (a loaded machine) closed it; ``info``'s
``close_lag_max_s`` says how late the latest close came.

Outcomes of an HTTP answer other than a stream (vLLM 0.32, vllm/entrypoints/serve/engine/protocol.py
``ErrorResponse`` body ``{"error": {"message", "type", "param", "code"}}``; the older flat body is read too):

- the engine refused the request (``rejected``, with the server's message as ``reason``): HTTP 400 for a prompt
  longer than ``max_model_len`` (vllm/renderers/params.py "This model's maximum context length is ...",
  vllm/v1/engine/input_processor.py "... longer than the maximum model length ..."), HTTP 503 from admission
  control (``--max-num-queued-reqs`` / ``--max-num-queued-tokens``, vllm/exceptions.py ``QueueOverflowError``,
  ``MaxQueuedTokensError``);
- the client is at fault (any other 4xx: a malformed request, an unknown model; a refused connection): the run is
  broken, not the engine.  The replay stops at the first such failure and :func:`replay` raises
  :class:`ReplayRequestError` naming it (the partial result rides on the exception);
- other failures (HTTP 5xx, a stream that ends early or breaks) are ``unfinished``, with the error as ``reason``.

``/metrics`` is scraped before and after, and every ``sample_interval_s`` during the run (raw text, parsed
afterwards so that parsing never delays a send).

Several servers (``base_url`` a list): the load generator is the router.  Each request goes to the replica that
``options.router`` (a ``sim.fleet`` router by name, ``options.router_params`` checked by ``sim.fleet.make_router``)
picks at its arrival, from what a router in front of them sees: the request (its prompt's block hashes at
``options.router_block_size`` from the trace's ``hash_ids``, its session id), its own counts per replica (routed;
outstanding: sent, response not ended) and, for a router that reads engine metrics, each server's last scraped
``/metrics`` (``vllm:num_requests_waiting``, ``..._running``, ``kv_cache_usage_perc``; as old as the sampling
interval).  Routers that track requests are told when a first token and an end reach the client.  The request
table gains ``replica`` (the index of the URL; -1: never sent), ``routed_s`` and ``router_end_s`` (trace seconds at
which the router placed the request, its arrival plus the client's lag, and at which it stopped counting it as
outstanding: the span a load-following router saw; NaN if never sent); the metrics are every server's summed (the KV
usage gauge averaged), and ``info["replicas"]`` holds each server's URL, request count and counters.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import aiohttp
import numpy as np

from replay.prom import (KV_USAGE, KV_USAGE_V0, RUNNING, SUMMARY_SAMPLES, TWIN_SLACK, TWIN_SPEED, WAITING,
                         MetricsSnapshot, parse_metrics)
from replay.results import ReplayResult, request_table_from_records
from sim.errors import KvtuneError
from sim.workload.workload import Workload

log = logging.getLogger("kvtune.replay")

ARRIVAL_HEADER = "X-Kvtune-Arrival"
CLASS_HEADER = "X-Kvtune-Class"


@dataclass
class ReplayOptions:
    """How to replay.  Times in options are trace seconds unless named ``*_wall_s``."""

    #: Replay ``speed`` times faster than the trace (for the twin run with the same ``--speed``); all times in
    #: the results are converted back to trace seconds.
    speed: float = 1.0
    #: Seeds the cancel draws and the prompt token ids.
    seed: int = 0
    #: Served model name; ``None`` = the first model of ``/v1/models``.
    model: str | None = None
    #: Clip ``max_tokens`` to ``max_model_len - prompt``; ``None`` = read from ``/v1/models`` (vLLM reports it).
    max_model_len: int | None = None
    #: Wall seconds between ``/metrics`` samples for the timeline (0: before and after only).
    sample_interval_wall_s: float = 0.25
    #: Give up on requests still open this long after the last arrival (trace seconds); they end ``unfinished``.
    drain_timeout_s: float | None = None
    #: Wall seconds between the start and trace time 0 (lets the first sends be prepared).
    start_delay_wall_s: float = 0.3
    #: Token ids are drawn uniformly from this range (valid for every vocabulary of 32k tokens or more).
    token_id_range: tuple[int, int] = (1000, 30000)
    #: Send the class's priority (vLLM's ``priority`` field) when it is not 0.
    send_priority: bool = True
    #: Keep every token's arrival time (``ReplayResult.token_times``).
    record_tokens: bool = True
    #: Tokens per ``hash_ids`` entry of a shared-prefix workload (the simulator's ``hash_block_tokens``); None:
    #: the workload's own (``Workload.hash_block_tokens``, Mooncake's 512 unless the trace or spec says otherwise),
    #: so that the replayed prompts share the blocks the simulation of the same workload shares.
    hash_block_tokens: int | None = None
    #: Extra HTTP headers (e.g. Authorization).
    headers: dict[str, str] = field(default_factory=dict)
    #: Per-request extra body fields.
    extra_body: dict = field(default_factory=dict)
    #: With several servers: the ``sim.fleet`` router that places each request (None: ``round_robin``); with one
    #: server and a router named, every request goes to it and the table still gets ``replica``.
    router: str | None = None
    #: The router's parameters (checked against its declared ranges).
    router_params: dict = field(default_factory=dict)
    #: Tokens per block of the router's prefix index (the engines' block size).
    router_block_size: int = 16


@dataclass
class _Record:
    """What the client saw of one request (wall times on the loop clock)."""

    index: int
    status: str = "unfinished"
    sent: float = math.nan
    first_token: float = math.nan
    end: float = math.nan
    tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    http_status: int | None = None
    finish_seen: bool = False
    #: The failure was the client's (see the module docstring): the run is an error.
    client_error: bool = False
    #: How long after its client deadline the stream closed (a late deadline: a loaded machine).
    close_lag: float = math.nan
    #: The server (index of the base URL) it was sent to; -1: not sent.
    replica: int = -1
    #: When the router placed it and when it stopped counting it as outstanding (routed runs only).
    routed: float = math.nan
    released: float = math.nan
    #: The server's ``usage.prompt_tokens_details.cached_tokens`` (vLLM's ``num_cached_tokens``: the prefix-cache
    #: hit of the request's first admission; sent with ``--enable-prompt-tokens-details``); -1: not reported.
    cached_tokens: int = -1


class ServerError(KvtuneError):
    """The server cannot be replayed against (unreachable, no model)."""


class ReplayRequestError(KvtuneError):
    """A request failed on the client's side (malformed request, refused connection): the replay is not a
    measurement.  ``result``: what was recorded up to the failure (``None`` after unpickling)."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.message = message
        self.result = result

    def __reduce__(self):
        return type(self), (self.message,)


#: vLLM's messages for a prompt the model cannot take (HTTP 400 that is the engine's rejection, not a bad request):
#: vllm 0.32 vllm/renderers/params.py and vllm/v1/engine/input_processor.py.
_TOO_LONG_MARKERS = ("maximum context length", "maximum model length")


def error_message(text: str) -> str:
    """The message of a vLLM error body (``{"error": {"message": ...}}``, or the flat ``{"message": ...}`` of
    older releases and the twin); the raw text when it is not JSON."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message") is not None:
            return str(err["message"])
        if isinstance(err, str):
            return err
    return text.strip()


def classify_http_error(status: int, message: str, prompt_too_long: bool = False) -> tuple[str, bool]:
    """``(status, client_error)`` of an HTTP answer that is not 200 (see the module docstring).
    ``prompt_too_long``: the prompt leaves no room for one output token within ``max_model_len`` (vLLM 0.32 then
    answers 400 "max_tokens must be at least 1, got 0" for a prompt of exactly ``max_model_len``)."""
    if status == 503:
        return "rejected", False
    if status == 400 and (prompt_too_long or any(m in message.lower() for m in _TOO_LONG_MARKERS)):
        return "rejected", False
    if 400 <= status < 500:
        return "unfinished", True
    return "unfinished", False


class _Replay:
    def __init__(self, base_url: str | Sequence[str], workload: Workload, options: ReplayOptions):
        if not options.speed > 0:
            raise KvtuneError(f"speed must be > 0, got {options.speed!r}")
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise KvtuneError("no server URL to replay against")
        self.urls = [u.rstrip("/") for u in urls]
        self.base_url = self.urls[0]
        self.workload = workload
        self.options = options
        df = workload.requests
        self.ids = df["request_id"].to_numpy(dtype=np.int64)
        self.classes = df["class"].astype(str).to_numpy()
        self.arrivals = df["arrival_s"].to_numpy(dtype=float)
        self.prompts = df["prompt_tokens"].to_numpy(dtype=np.int64)
        self.outputs = df["output_tokens"].to_numpy(dtype=np.int64)
        timeout_at, cancel_at = workload.client_deadlines(options.seed)
        self.timeout_at, self.cancel_at = timeout_at, cancel_at
        self.priorities = workload.priorities()
        self.hash_ids = df["hash_ids"].to_numpy() if "hash_ids" in df.columns else None
        self.hash_block_tokens = int(options.hash_block_tokens or workload.hash_block_tokens)
        self.records = [_Record(i) for i in range(len(df))]
        self.samples: list[tuple[float, str]] = []
        self.model = options.model
        self.max_model_len = options.max_model_len
        self.t0 = 0.0
        self.unix_t0 = 0.0
        #: Wall seconds the server's engine clock runs behind its arrivals (the twin's ``--slack-ms``, which it
        #: exports as ``kvtune:twin_slack_seconds``; 0 for vLLM): what is received and every client deadline are
        #: read on the engine's clock, so that the results are in trace time.
        self.recv_offset = 0.0
        #: Index of the first request that failed on the client's side (the run stops there).
        self.first_failure: int | None = None
        self._failed: asyncio.Event | None = None
        self._setup_router(workload, options)

    def _setup_router(self, workload: Workload, options: ReplayOptions) -> None:
        """The router across ``self.urls`` (None for one server and no router named) and what it reads."""
        self.routed = len(self.urls) > 1 or options.router is not None
        self.router = None
        self.samples_by_replica: list[list[tuple[float, str]]] = [[] for _ in self.urls]
        if not self.routed:
            return
        from sim.engine.config import EngineConfig
        from sim.fleet import RequestView, make_router
        from sim.runner import RequestStore

        self.router = make_router(options.router or "round_robin", options.router_params, len(self.urls),
                                  options.seed)
        df = workload.requests
        # The prompt's block hashes as the simulated fleet's routers get them (sim.runner keys blocks by hash id).
        config = EngineConfig(block_size=int(options.router_block_size), enable_prefix_caching=True)
        keys = RequestStore(workload, config, options.seed, workload.hash_block_tokens, None, False).keys
        column = next((c for c in ("session_id", "conversation_id") if c in df.columns), None)
        sessions = df[column].tolist() if column is not None else [None] * len(df)
        self.request_views = [
            RequestView(index=i, arrival_s=float(self.arrivals[i]), class_name=str(self.classes[i]),
                        prompt_tokens=int(self.prompts[i]), block_hashes=keys[i],
                        block_size=int(options.router_block_size),
                        session_id=None if s is None or (isinstance(s, float) and s != s) else s)
            for i, s in enumerate(sessions)]
        self.routed_count = [0] * len(self.urls)
        self.outstanding = [0] * len(self.urls)
        #: Each server's last scraped (num_waiting, num_running, kv_usage), for routers that read metrics.
        self.published: list[tuple[float, float, float] | None] = [None] * len(self.urls)

    def _route(self, i: int) -> int:
        """The replica of request ``i`` at its arrival (the router's decision, checked)."""
        from sim.fleet import ReplicaView

        views = []
        for r in range(len(self.urls)):
            pub = self.published[r] if self.router.reads_metrics else None
            if pub is None:
                views.append(ReplicaView(index=r, routed=self.routed_count[r], outstanding=self.outstanding[r]))
            else:
                views.append(ReplicaView(index=r, routed=self.routed_count[r], outstanding=self.outstanding[r],
                                         num_waiting=int(pub[0]), num_running=int(pub[1]), kv_usage=float(pub[2])))
        chosen = self.router.route(self.request_views[i], views)
        if isinstance(chosen, bool) or not isinstance(chosen, (int, np.integer)) or not 0 <= chosen < len(self.urls):
            raise KvtuneError(f"router {self.router.name!r} returned {chosen!r} for request {i}")
        chosen = int(chosen)
        self.routed_count[chosen] += 1
        self.outstanding[chosen] += 1
        return chosen

    def _ended(self, rec: _Record, loop) -> None:
        """Request ``rec`` left its replica (for the router's counts and hooks)."""
        if self.router is None or rec.replica < 0:
            return
        self.outstanding[rec.replica] -= 1
        rec.released = loop.time()
        if self.router.tracks_requests:
            self.router.on_complete(rec.index, rec.replica, self.trace_time(loop.time()))

    def _fail(self, i: int) -> None:
        if self.first_failure is None:
            self.first_failure = i
        if self._failed is not None:
            self._failed.set()

    # ---- clock ---------------------------------------------------------------------------------------
    def trace_time(self, wall: float) -> float:
        """Trace seconds of a wall time at which something was received (or a client deadline)."""
        return (wall - self.t0 - self.recv_offset) * self.options.speed

    def wall_time(self, trace_s: float) -> float:
        """Wall time at which a request arriving at ``trace_s`` is sent."""
        return self.t0 + trace_s / self.options.speed

    def deadline_wall(self, trace_s: float) -> float:
        """Wall time at which a client deadline at ``trace_s`` closes the stream."""
        return self.t0 + self.recv_offset + trace_s / self.options.speed

    # ---- setup ---------------------------------------------------------------------------------------
    async def _discover(self, session: aiohttp.ClientSession) -> None:
        """The served model (the first of the first server's, unless named) and ``max_model_len`` (the smallest
        over the servers); every server must serve it."""
        for url in self.urls:
            try:
                async with session.get(url + "/v1/models") as resp:
                    if resp.status != 200:
                        raise ServerError(f"{url}/v1/models answered HTTP {resp.status}")
                    data = (await resp.json()).get("data") or []
            except (aiohttp.ClientError, OSError) as exc:
                raise ServerError(f"cannot reach {url}: {exc}") from None
            if not data:
                raise ServerError(f"{url}/v1/models lists no model")
            entry = data[0]
            if self.model is not None:
                entry = next((m for m in data if m.get("id") == self.model), None)
                if entry is None:
                    served = [m.get("id") for m in data]
                    raise ServerError(f"{url} does not serve {self.model!r} (it serves {served})")
            self.model = entry["id"]
            if entry.get("max_model_len") and self.options.max_model_len is None:
                length = int(entry["max_model_len"])
                self.max_model_len = length if self.max_model_len is None else min(self.max_model_len, length)

    async def _scrape_one(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url + "/metrics") as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except aiohttp.ClientError:
            return None

    async def _scrape_all(self, session: aiohttp.ClientSession) -> list[str | None]:
        if len(self.urls) == 1:
            return [await self._scrape_one(session, self.base_url)]
        return list(await asyncio.gather(*(self._scrape_one(session, url) for url in self.urls)))

    async def _scrape(self, session: aiohttp.ClientSession) -> str | None:
        """Every server's ``/metrics`` as one text (each sample labelled ``kvtune_replica``: totals add up)."""
        return _merge_texts(await self._scrape_all(session))

    # ---- requests ------------------------------------------------------------------------------------
    def _body(self, i: int) -> bytes:
        opts = self.options
        n = int(self.prompts[i])
        rng = np.random.default_rng([opts.seed, int(self.ids[i]) & 0x7FFFFFFF])
        low, high = opts.token_id_range
        ids = rng.integers(low, high, size=n)
        hashes = self.hash_ids[i] if self.hash_ids is not None else None
        if hashes is not None and len(hashes):
            # Shared prefixes: hash id h names one block of hash_block_tokens tokens, the same for every request
            # that lists it (and, as in Mooncake's traces, everything before it), so the server's prefix cache
            # hits where the simulator's does (sim.runner keys blocks by the same ids).
            size = self.hash_block_tokens
            blocks = [np.random.default_rng([opts.seed, 0x5EED, int(h) & 0x7FFFFFFF]).integers(low, high, size=size)
                      for h in hashes]
            shared = np.concatenate(blocks)[:n]
            ids[:len(shared)] = shared
        max_tokens = int(self.outputs[i])
        if self.max_model_len is not None and n < self.max_model_len:
            max_tokens = max(1, min(max_tokens, self.max_model_len - n))
        fields = {
            "model": self.model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if opts.send_priority and self.priorities[i] != 0:
            fields["priority"] = int(self.priorities[i])
        fields.update(opts.extra_body)
        head = json.dumps(fields)[:-1]
        return (head + ', "prompt": [' + ",".join(map(str, ids.tolist())) + "]}").encode()

    async def _dispatch(self, session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        tasks = []
        lead = 0.05  # wall seconds ahead of a send at which its body is built
        for i in range(len(self.records)):
            start = self.wall_time(self.arrivals[i])
            delay = start - lead - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = self._body(i)
            if self.router is not None:
                # Decided at the arrival, in arrival order, from what the router has seen by then.
                delay = start - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.records[i].replica = self._route(i)
                self.records[i].routed = loop.time()
            else:
                self.records[i].replica = 0
            tasks.append(loop.create_task(self._request(session, i, body, start)))
        await asyncio.gather(*tasks)

    async def _request(self, session: aiohttp.ClientSession, i: int, body: bytes, start: float) -> None:
        loop = asyncio.get_running_loop()
        rec = self.records[i]
        delay = start - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        deadline = min(self.timeout_at[i], self.cancel_at[i])
        abort_status = "timed_out" if self.timeout_at[i] <= self.cancel_at[i] else "cancelled"
        # "<run epoch, Unix seconds>;<wall seconds after it>": the epoch is the same string for the whole run, so
        # a server converts it to its own clock once and keeps the trace's arrival differences exact.
        headers = {"Content-Type": "application/json",  # vLLM answers 400 "Unsupported Media Type" without it
                   ARRIVAL_HEADER: f"{self.unix_t0!r};{float(self.arrivals[i]) / self.options.speed!r}",
                   CLASS_HEADER: self.classes[i]}
        when = self.deadline_wall(deadline) if deadline < math.inf else None
        rec.sent = loop.time()
        url = self.urls[max(rec.replica, 0)]
        try:
            await self._send(session, rec, i, url, body, headers, when, loop, abort_status)
        finally:
            self._ended(rec, loop)

    async def _send(self, session, rec: _Record, i: int, url: str, body: bytes, headers: dict, when, loop,
                    abort_status: str) -> None:
        try:
            async with asyncio.timeout_at(when):
                async with session.post(url + "/v1/completions", data=body, headers=headers) as resp:
                    rec.http_status = resp.status
                    if resp.status != 200:
                        message = " ".join(error_message(await resp.text()).split())[:500]
                        too_long = self.max_model_len is not None and self.prompts[i] >= self.max_model_len
                        rec.status, rec.client_error = classify_http_error(resp.status, message, too_long)
                        rec.error = f"HTTP {resp.status}: {message}"
                        rec.end = loop.time()
                        if rec.client_error:
                            self._fail(i)
                        return
                    try:
                        await self._read_stream(resp, rec, loop, when)
                    finally:
                        if not rec.finish_seen:
                            resp.close()  # drop the connection: the server sees the client leave
            if not rec.finish_seen and rec.error is None:
                rec.status = "unfinished"
                rec.error = "stream ended without a finish reason"
                rec.end = loop.time()
        except TimeoutError:
            rec.close_lag = max(loop.time() - when, 0.0)  # (asyncio may fire a timer a clock tick early)
            if not rec.finish_seen:
                rec.status = abort_status
                rec.end = when
        except aiohttp.ClientConnectorError as exc:  # refused / unreachable: the client's failure
            rec.status, rec.client_error = "unfinished", True
            rec.error = f"cannot connect to {url}: {exc}"[:500]
            rec.end = loop.time()
            self._fail(i)
        except (aiohttp.ClientError, json.JSONDecodeError, ValueError) as exc:
            if not rec.finish_seen:
                rec.status = "unfinished"
                rec.error = f"{type(exc).__name__}: {exc}"[:500]
                rec.end = loop.time()
        except asyncio.CancelledError:
            if not rec.finish_seen:
                rec.status = "unfinished"
                rec.error = "replay stopped (drain timeout)"
                rec.end = loop.time()
            raise

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: _Record, loop, when: float | None) -> None:
        """Consume the SSE stream: count tokens (per-chunk usage when the server sends it, else one per chunk),
        note when each came and the finish.  Whatever bytes are buffered are parsed in one go, stamped with the
        time they were read.

        When a client deadline cancels the read, the bytes the connection had already delivered are counted too.
        They came before the cancel took effect: when this process is descheduled across a deadline, the event loop
        wakes with both the socket's data and the overdue deadline ready and runs the deadline first, so those
        tokens would otherwise be lost (tests/replay/test_deadline_drain.py: 1 token counted of 4 delivered).  They
        are stamped at the deadline ``when`` at the latest (the row ends there, so no token comes after its end).
        How late the close came is ``rec.close_lag``."""
        buf = b""
        try:
            async for data in resp.content.iter_any():
                buf, done = self._take(rec, buf, data, loop.time())
                if done:
                    return
        except asyncio.CancelledError:
            try:
                data = resp.content.read_nowait()
            except Exception:  # noqa: BLE001 - the connection failed meanwhile: nothing more was delivered
                data = b""
            if data:
                now = loop.time()
                self._take(rec, buf, data, now if when is None or now < when else when)
            raise

    def _take(self, rec: _Record, buf: bytes, data: bytes, t: float) -> tuple[bytes, bool]:
        """Parse ``data`` (after the partial line ``buf``) read at ``t`` into ``rec``; returns the new partial line
        and whether the stream is over (``[DONE]`` or an error chunk)."""
        buf += data
        if b"\n" not in data:
            return buf, False
        lines = buf.split(b"\n")
        buf = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return buf, True
            chunk = json.loads(payload)
            choices = chunk.get("choices")
            if choices:
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    count = int(usage["completion_tokens"])
                else:
                    count = rec.tokens + 1
                new = count - rec.tokens
                if new > 0:
                    if rec.tokens == 0:
                        rec.first_token = t
                        if self.router is not None and self.router.tracks_requests:
                            self.router.on_first_token(rec.index, rec.replica, self.trace_time(t))
                    if self.options.record_tokens:
                        rec.token_times.extend([t] * new)
                    rec.tokens = count
                reason = choices[0].get("finish_reason")
                if reason:
                    rec.end = t
                    rec.finish_seen = True
                    rec.status = "finished" if reason in ("length", "stop") else "unfinished"
                    if rec.status != "finished":
                        rec.error = f"finish_reason {reason}"
            elif chunk.get("usage") and chunk["usage"].get("prompt_tokens_details"):
                # The final usage chunk (no choices) carries the request's prefix-cache hit.
                rec.cached_tokens = int(chunk["usage"]["prompt_tokens_details"].get("cached_tokens") or 0)
            elif "error" in chunk or chunk.get("object") == "error":
                rec.error = error_message(payload.decode(errors="replace"))[:500]
                rec.status = "unfinished"
                rec.end = t
                return buf, True
        return buf, False

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        interval = self.options.sample_interval_wall_s
        loop = asyncio.get_running_loop()
        while True:
            texts = await self._scrape_all(session)
            now = loop.time()
            text = _merge_texts(texts)
            if text is not None:
                self.samples.append((now, text))
            self._publish(texts)
            await asyncio.sleep(interval)

    def _publish(self, texts: list[str | None]) -> None:
        """Each server's scraped figures, as a metric-reading router gets them (its last scrape of that server)."""
        if self.router is None or not self.router.reads_metrics:
            return
        for r, one in enumerate(texts):
            if one:
                snap = parse_metrics(one, names=_ROUTER_SAMPLES)
                usage = snap.kv_usage()
                self.published[r] = (snap.total(WAITING) if snap.has(WAITING) else 0.0,
                                     snap.total(RUNNING) if snap.has(RUNNING) else 0.0,
                                     usage if usage == usage else 0.0)

    # ---- run -----------------------------------------------------------------------------------------
    async def run(self) -> ReplayResult:
        opts = self.options
        loop = asyncio.get_running_loop()
        wall_start = time.time()
        # Objects alive now never need collecting: keeps full GC passes (ms-long pauses) off the send path.
        gc.collect()
        gc.freeze()
        try:
            return await self._run(opts, loop, wall_start)
        finally:
            gc.unfreeze()

    async def _run(self, opts: ReplayOptions, loop, wall_start: float) -> ReplayResult:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=opts.headers) as session:
            await self._discover(session)
            before_texts = await self._scrape_all(session)
            before_text = _merge_texts(before_texts)
            before_at = loop.time()
            # A metric-reading router has every server's figures from the first request on: the scrape before the
            # run is its first (the sampler's first scrape can come after the first arrival is routed).
            if self.router is not None and self.router.reads_metrics:
                self._publish(before_texts)
                unread = [url for url, pub in zip(self.urls, self.published) if pub is None]
                if unread:
                    raise ServerError(f"{unread[0]} serves no /metrics, which router {self.router.name!r} reads")
            for url, text in zip(self.urls, before_texts):  # each server's own (a merged text sums them)
                if not text:
                    continue
                snap = parse_metrics(text)
                slack = snap.total(TWIN_SLACK)
                if slack == slack and slack > 0:
                    self.recv_offset = max(self.recv_offset, slack)
                twin_speed = snap.total(TWIN_SPEED)
                if twin_speed == twin_speed and abs(twin_speed - opts.speed) > 1e-9 * twin_speed:
                    raise ServerError(f"{url} is a twin running at speed {twin_speed:g} but the replay "
                                      f"runs at speed {opts.speed:g}: give both the same speed")
            self.t0 = loop.time() + opts.start_delay_wall_s
            self.unix_t0 = float(time.time() + (self.t0 - loop.time()))
            sampler = loop.create_task(self._sample(session)) if opts.sample_interval_wall_s > 0 else None
            self._failed = asyncio.Event()
            dispatcher = loop.create_task(self._dispatch(session))
            failed = loop.create_task(self._failed.wait())
            try:
                limit = None
                if opts.drain_timeout_s is not None:
                    last = float(self.arrivals[-1]) if len(self.arrivals) else 0.0
                    limit = max(self.deadline_wall(last + opts.drain_timeout_s) - loop.time(), 0.0)
                # Ends when every request is done, at the drain timeout, or at the first client-side failure.
                await asyncio.wait({dispatcher, failed}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
                if not dispatcher.done():
                    dispatcher.cancel()
                    await asyncio.gather(dispatcher, return_exceptions=True)
                elif dispatcher.exception() is not None:
                    raise dispatcher.exception()
            finally:
                failed.cancel()
                if sampler is not None:
                    sampler.cancel()
                    try:
                        await sampler
                    except asyncio.CancelledError:
                        pass
            # Let the server's counters settle (aborts are applied at its next step boundary).
            await asyncio.sleep(min(0.5, max(0.05, opts.sample_interval_wall_s)))
            after_texts = await self._scrape_all(session)
            after_text = _merge_texts(after_texts)
            after_at = loop.time()
        result = self._result(before_text, before_at, after_text, after_at, wall_start)
        if self.routed:
            result.info["router"] = self.router.name
            result.info["router_params"] = {k: getattr(self.router, k) for k in type(self.router).params}
            result.info["urls"] = list(self.urls)
            result.info["replicas"] = [{
                "url": url,
                "requests": int(sum(1 for rec in self.records if rec.replica == r)),
                "metrics_before": parse_metrics(b).summary() if b else {},
                "metrics_after": parse_metrics(a).summary() if a else {},
            } for r, (url, b, a) in enumerate(zip(self.urls, before_texts, after_texts))]
        return result

    def _result(self, before_text, before_at, after_text, after_at, wall_start) -> ReplayResult:
        to_trace = self.trace_time
        before = parse_metrics(before_text, to_trace(before_at)) if before_text else None
        after = parse_metrics(after_text, to_trace(after_at)) if after_text else None
        snaps: list[MetricsSnapshot] = []
        if before is not None:
            snaps.append(before)
        snaps += [parse_metrics(text, to_trace(t), SUMMARY_SAMPLES) for t, text in self.samples]
        if after is not None:
            snaps.append(after)
        records = self.records
        token_times = None
        if self.first_failure is not None:  # requests the stopped run never sent
            for r in records:
                if r.sent != r.sent and r.error is None:
                    r.error = "not sent: the replay stopped at a client-side failure"
        requests = request_table_from_records(self.workload, records, to_trace)
        if any(r.cached_tokens >= 0 for r in records):
            requests["prefix_hit_tokens"] = [float(r.cached_tokens) if r.cached_tokens >= 0 else math.nan
                                             for r in records]
        if self.routed:
            requests["replica"] = np.array([r.replica for r in records], dtype=np.int64)
            # Trace seconds on the client's clock, as a send is scheduled (wall_time's inverse).
            for column, attr in (("routed_s", "routed"), ("router_end_s", "released")):
                requests[column] = [(getattr(r, attr) - self.t0) * self.options.speed for r in records]
        if self.options.record_tokens:
            token_times = {
                int(self.ids[r.index]): (np.asarray(r.token_times, dtype=float) - self.t0 - self.recv_offset)
                * self.options.speed for r in records
            }
        lags = np.array([r.sent - self.wall_time(self.arrivals[r.index]) for r in records if r.sent == r.sent])
        close_lags = [r.close_lag for r in records if r.close_lag == r.close_lag]
        errors = [(int(self.ids[r.index]), r.error) for r in records if r.error]
        info = {
            "url": self.base_url,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "speed": self.options.speed,
            "seed": self.options.seed,
            "started_unix": wall_start,
            "wall_s": time.time() - wall_start,
            "num_requests": len(records),
            "twin_slack_s": self.recv_offset,
            "send_lag_max_s": float(lags.max() * self.options.speed) if len(lags) else 0.0,
            "send_lag_p99_s": float(np.quantile(lags, 0.99) * self.options.speed) if len(lags) else 0.0,
            "send_lag_p50_s": float(np.quantile(lags, 0.5) * self.options.speed) if len(lags) else 0.0,
            # How late streams closed after their client deadlines (what a loaded client adds to what it counts).
            "close_lag_max_s": float(max(close_lags) * self.options.speed) if close_lags else 0.0,
            "num_samples": len(self.samples),
            "errors": errors[:50],
            "num_errors": len(errors),
            "client_errors": sum(1 for r in records if r.client_error),
            "first_client_error": (None if self.first_failure is None else
                                   [int(self.ids[self.first_failure]), records[self.first_failure].error]),
        }
        return ReplayResult.from_snapshots(requests, snaps, before, after, token_times, info, self.workload)


def _merge_texts(texts: list[str | None]) -> str | None:
    """One server's ``/metrics`` text as it is; several servers' as one text whose samples carry a
    ``kvtune_replica`` label (so that ``MetricsSnapshot`` sums counters over them and averages the usage gauge).
    None when no server answered."""
    if len(texts) == 1:
        return texts[0]
    if all(t is None for t in texts):
        return None
    lines = []
    for r, text in enumerate(texts):
        for line in (text or "").splitlines():
            if not line or line[0] == "#":
                continue
            brace, space = line.find("{"), line.find(" ")
            if 0 <= brace < space or (brace >= 0 and space < 0):
                lines.append(f'{line[:brace]}{{kvtune_replica="{r}",{line[brace + 1:]}')
            elif space > 0:
                lines.append(f'{line[:space]}{{kvtune_replica="{r}"}}{line[space:]}')
    return "\n".join(lines) + "\n"


#: What a metrics-reading router reads of a scrape.
_ROUTER_SAMPLES = frozenset({WAITING, RUNNING, KV_USAGE, KV_USAGE_V0})


async def replay_async(base_url: str | Sequence[str], workload: Workload,
                       options: ReplayOptions | None = None) -> ReplayResult:
    """Replay ``workload`` against the server at ``base_url`` (e.g. ``http://127.0.0.1:8000``), or routed across
    several (a list, see the module docstring).  Raises ServerError when a server cannot be reached,
    ReplayRequestError at a client-side request failure."""
    result = await _Replay(base_url, workload, options or ReplayOptions()).run()
    first = result.info.get("first_client_error")
    if first is not None:
        n = result.info["client_errors"]
        raise ReplayRequestError(f"{base_url}: request {first[0]} failed: {first[1]} ({n} client-side failure"
                                 f"{'s' if n != 1 else ''}; the replay stopped)", result)
    return result


def replay(base_url: str | Sequence[str], workload: Workload, options: ReplayOptions | None = None, **kwargs) -> ReplayResult:
    """Blocking :func:`replay_async`; keyword arguments override fields of ``options``."""
    options = options or ReplayOptions()
    if kwargs:
        options = ReplayOptions(**{**options.__dict__, **kwargs})
    return asyncio.run(replay_async(base_url, workload, options))


__all__ = ["ReplayOptions", "ReplayRequestError", "ServerError", "classify_http_error", "error_message", "replay",
           "replay_async"]
