"""The digital twin's HTTP side: vLLM's OpenAI-compatible API and ``/metrics``, served by aiohttp.

Endpoints: ``POST /v1/completions`` (streaming SSE and not; ``prompt`` as text or token ids), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (vLLM metric names), ``GET /version``.  Tokens are placeholders (``" tok"``);
their number, timing, queueing and preemption are the simulator's.  Requests are validated as vLLM does
(prompt + max_tokens within max_model_len, n == 1, priority only under the priority policy) with vLLM's
error body.  A client that disconnects is aborted: its KV blocks are freed at the next step boundary.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import secrets
import signal
import time
import uuid
from collections.abc import Callable

from aiohttp import ClientConnectionResetError, web
from prometheus_client import CollectorRegistry, generate_latest

from replay.twin_engine import TokenSink, TwinEngine
from replay.twin_collector import TwinCollector
from sim.engine.request import Status
from sim.errors import EngineAborted, short_repr

log = logging.getLogger("kvtune.twin")

TOKEN_TEXT = " tok"
#: Header with the client's intended send time (``<run epoch, Unix s>;<offset s>``); honoured with --slack-ms.
ARRIVAL_HEADER = "X-Kvtune-Arrival"
#: Header naming the request's class (for kvtune's predicted admission); vLLM ignores it.
CLASS_HEADER = "X-Kvtune-Class"
ENGINE_KEY = web.AppKey("engine", TwinEngine)
SERVED_KEY = web.AppKey("served_model_name", str)
REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)
EPOCHS_KEY = web.AppKey("arrival_epochs", dict)


# ---- /metrics: replay.twin_metrics.TwinCollector -----------------------------------------------------------


# ---- helpers -------------------------------------------------------------------------------------------
def error_response(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    """vLLM's ErrorResponse body."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


_WORD = re.compile(r"\S+")
#: Request bodies larger than this get 413 (``--max-body-bytes``); vLLM's prompts are bounded by max_model_len.
DEFAULT_MAX_BODY_BYTES = 8 * 2**20


def count_prompt_tokens(prompt, vocab_size: int | None = None) -> int:
    """Tokens of a prompt: the length of a token-id list; for text, whitespace-separated words (placeholder
    tokenizer; counted without building a list of them).  Raises ValueError for anything else, and as vLLM 0.32
    does for an empty prompt (v1/engine/input_processor.py) and for token ids outside ``[0, vocab_size)``
    (renderers/base.py)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        count = sum(1 for _ in _WORD.finditer(prompt))
        if not count:
            raise ValueError("The decoder prompt cannot be empty")
        return count
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        low, high = min(prompt), max(prompt)
        if low < 0:
            raise ValueError(f"Token id {low} is out of vocabulary")
        if vocab_size is not None and high >= vocab_size:
            raise ValueError(f"Token id {high} is out of vocabulary")
        return len(prompt)
    if isinstance(prompt, list) and not prompt:
        raise ValueError("The decoder prompt cannot be empty")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt):
        raise ValueError("the twin serves one prompt per request (batched prompts are not supported)")
    raise ValueError("prompt must be a non-empty string or a list of token ids")


class _Chunks:
    """Pre-formatted SSE pieces of one completion stream (json.dumps per token is the server's hot path)."""

    def __init__(self, request_id: str, created: int, model: str, prompt_tokens: int, continuous: bool):
        self.head = ('data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,'
                     '"text":%s,"logprobs":null,"finish_reason":' % (request_id, created, json.dumps(model),
                                                                     json.dumps(TOKEN_TEXT)))
        self.prompt_tokens = prompt_tokens
        self.continuous = continuous
        self.request_id = request_id
        self.created = created
        self.model = model

    def usage(self, completion: int) -> str:
        p = self.prompt_tokens
        return '{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (p, p + completion, completion)

    def token(self, index: int, finish: str | None) -> str:
        reason = "null" if finish is None else '"%s"' % finish
        usage = self.usage(index) if self.continuous else "null"
        return self.head + reason + ',"stop_reason":null}],"usage":' + usage + "}\n\n"

    def final_usage(self, completion: int) -> str:
        return ('data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[],"usage":%s}\n\n'
                % (self.request_id, self.created, json.dumps(self.model), self.usage(completion)))


# ---- handlers ------------------------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.dead:
        return web.Response(status=503, text=engine.dead)
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "kvtune-twin"})


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    name = request.app[SERVED_KEY]
    return web.json_response({
        "object": "list",
        "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "kvtune", "root": name,
            "parent": None, "max_model_len": engine.max_model_len, "permission": [],
        }],
    })


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY_KEY]
    return web.Response(body=generate_latest(registry),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _parse_arrival(request: web.Request, engine: TwinEngine) -> float | None:
    """The client's intended send time on the engine's clock, or None.

    Header ``X-Kvtune-Arrival: <epoch>;<offset>``: ``epoch`` (Unix seconds) names the client's run and is the
    same for all its requests, ``offset`` the wall seconds after it.  Each epoch is converted to the engine's
    clock once, so that arrival differences between requests stay exact (the trace has requests microseconds
    apart whose order must not flip).
    """
    header = request.headers.get(ARRIVAL_HEADER)
    if not header or engine.slack_s <= 0:
        return None  # without slack a hint could not be honoured: arrivals are stamped on receipt
    epoch_text, sep, offset_text = header.partition(";")
    try:
        offset = float(offset_text) if sep else 0.0
        epoch_unix = float(epoch_text)
    except ValueError:
        return None
    epochs: dict[str, float] = request.app[EPOCHS_KEY]
    base = epochs.get(epoch_text)
    if base is None:
        if len(epochs) > 64:
            epochs.clear()
        base = epochs[epoch_text] = engine.clock() - (time.time() - epoch_unix)
    return base + offset


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    served = request.app[SERVED_KEY]
    arrival_wall = _parse_arrival(request, engine)
    try:
        body = json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error_response(400, "request body is not valid JSON")
    except RecursionError:
        return error_response(400, "request body is nested too deeply")
    if not isinstance(body, dict):
        return error_response(400, "request body must be a JSON object")
    problem = _check_fields(body)
    if problem is not None:
        return error_response(400, problem)
    model = body.get("model")
    if model is not None and model != served:
        return error_response(404, f"The model `{model}` does not exist.", "NotFoundError")
    try:
        prompt_tokens = count_prompt_tokens(body.get("prompt"), getattr(engine.model, "vocab_size", None))
    except ValueError as exc:
        return error_response(400, str(exc))
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None:
        max_tokens = engine.max_model_len - prompt_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return error_response(400, f"max_tokens must be at least 1, got {max_tokens}.")
    n = body.get("n", 1)
    if n not in (1, None):
        return error_response(400, "the twin supports n=1 only")
    limit = engine.max_model_len
    if prompt_tokens + max_tokens > limit:
        return error_response(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    priority = body.get("priority", 0) or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        return error_response(400, f"priority must be an integer, got {priority!r}")
    if priority != 0 and engine.config.scheduling_policy != "priority":
        return error_response(400, "Got priority != 0 but the scheduling policy is not 'priority'.")
    stream = bool(_lax_bool(body.get("stream")))
    options = body.get("stream_options") or {}
    if options and not stream:
        return error_response(400, "Stream options can only be defined when `stream=True`.")
    class_name = request.headers.get(CLASS_HEADER, "default")
    try:
        sink = engine.submit(prompt_tokens, max_tokens, class_name=class_name, priority=priority,
                             arrival_wall=arrival_wall)
    except EngineAborted as exc:
        return error_response(503, str(exc), "ServiceUnavailableError")
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    try:
        if stream:
            return await _stream(request, sink, _Chunks(request_id, created, served, prompt_tokens,
                                                        bool(_lax_bool(options.get("continuous_usage_stats")))),
                                 bool(_lax_bool(options.get("include_usage"))))
        return await _whole(sink, request_id, created, served, prompt_tokens)
    finally:
        if not sink.done:
            engine.abort(sink)  # client gone (disconnect cancels the handler, or a write failed)


# pydantic's lax bool (vLLM's request models are pydantic): these strings are booleans, others a 400.
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _lax_bool(value):
    """``value`` as pydantic reads a ``bool`` field (``None`` stays ``None``); ValueError if it is none."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(value)


def _check_fields(body: dict) -> str | None:
    """What vLLM's CompletionRequest (pydantic) refuses with 400 among the fields the twin reads or ignores:
    non-boolean ``stream`` / ``echo``, a non-object ``stream_options``, non-numeric sampling parameters."""
    for key in ("stream", "echo", "ignore_eos"):
        try:
            _lax_bool(body.get(key))
        except ValueError:
            return f"{key}: Input should be a valid boolean, got {short_repr(body.get(key))}"
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return f"stream_options: Input should be a valid dictionary or object, got {short_repr(options)}"
        for key in ("include_usage", "continuous_usage_stats"):
            try:
                _lax_bool(options.get(key))
            except ValueError:
                return f"stream_options.{key}: Input should be a valid boolean, got {short_repr(options.get(key))}"
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return f"{key}: Input should be a valid number, got {short_repr(body.get(key))}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{key}: Input should be a finite number, got {short_repr(body.get(key))}"
    return None


async def _whole(sink: TokenSink, request_id: str, created: int, model: str, prompt_tokens: int) -> web.Response:
    while not sink.done:
        await sink.event.wait()
        sink.event.clear()
    if sink.status != Status.FINISHED:
        return error_response(500, sink.error or f"request ended {sink.status.value}", "InternalServerError")
    return web.json_response({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": TOKEN_TEXT * sink.tokens, "logprobs": None, "finish_reason": "length",
                     "stop_reason": None, "prompt_logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + sink.tokens,
                  "completion_tokens": sink.tokens},
    })


async def _stream(request: web.Request, sink: TokenSink, chunks: _Chunks, include_usage: bool) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                   "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = 0
    while True:
        await sink.event.wait()
        sink.event.clear()
        tokens, done = sink.tokens, sink.done
        finished = done and sink.status == Status.FINISHED
        parts = []
        while sent < tokens:
            sent += 1
            parts.append(chunks.token(sent, "length" if finished and sent == tokens else None))
        if done:
            if not finished:
                message = sink.error or f"request ended {sink.status.value if sink.status else 'unexpectedly'}"
                parts.append("data: " + json.dumps({"error": {"object": "error", "message": message,
                                                              "type": "InternalServerError", "code": 500}}) + "\n\n")
            elif include_usage:
                parts.append(chunks.final_usage(sent))
            parts.append("data: [DONE]\n\n")
        if parts:
            try:
                await resp.write("".join(parts).encode())
            except (ConnectionError, ClientConnectionResetError):
                return resp  # an ordinary client disconnect: the handler's finally aborts the request
        if done:
            break
    try:
        await resp.write_eof()
    except (ConnectionError, ClientConnectionResetError):
        pass
    return resp


# ---- app and runner ------------------------------------------------------------------------------------
def _api_key_middleware(api_key: str):
    """vLLM's ``--api-key`` (0.32, entrypoints/serve/middleware/authenticate.py): paths under ``/v1`` need
    ``Authorization: Bearer <key>``, else 401 ``{"error": "Unauthorized"}``; OPTIONS and other paths pass."""
    digest = hashlib.sha256(api_key.encode()).digest()

    @web.middleware
    async def check(request: web.Request, handler):
        if request.method != "OPTIONS" and request.path.startswith("/v1"):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                    hashlib.sha256(token.encode()).digest(), digest):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def make_app(engine: TwinEngine, served_model_name: str, *, api_key: str | None = None,
             max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> web.Application:
    """The aiohttp application around a (not yet started) engine; the engine starts and stops with the app.
    ``api_key``: required on ``/v1`` requests.  ``max_body_bytes``: larger bodies get 413."""
    app = web.Application(client_max_size=max_body_bytes,
                          middlewares=[_api_key_middleware(api_key)] if api_key else [])
    app[ENGINE_KEY] = engine
    app[SERVED_KEY] = served_model_name
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TwinCollector(engine, served_model_name))
    app[REGISTRY_KEY] = registry
    app[EPOCHS_KEY] = {}
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)

    async def lifecycle(app: web.Application):
        engine.start()
        yield
        await engine.close()

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve(
    engine_factory: Callable[[], TwinEngine],
    served_model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None).  ``on_ready(url)`` is called once
    the socket listens (``port=0`` picks a free port)."""
    engine = engine_factory()
    app = make_app(engine, served_model_name, api_key=api_key, max_body_bytes=max_body_bytes)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        bound = runner.addresses[0]
        url = f"http://{host}:{bound[1]}"
        if on_ready is not None:
            on_ready(url)
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, stop.set)
                except (NotImplementedError, RuntimeError):  # not the main thread
                    pass
        stopped = asyncio.ensure_future(stop.wait())
        died = asyncio.ensure_future(engine.died.wait())
        await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
        for fut in (stopped, died):
            fut.cancel()
        if engine.dead:
            log.error("twin engine died (%s); shutting down", engine.dead)
            await asyncio.sleep(0.5)  # let the error responses go out
    finally:
        await runner.cleanup()


__all__ = ["ARRIVAL_HEADER", "CLASS_HEADER", "TwinCollector", "count_prompt_tokens", "make_app", "serve"]
