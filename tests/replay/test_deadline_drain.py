"""A client deadline that fires while this process was descheduled still counts the tokens the connection had
delivered before it.  The event loop wakes with the socket's data and the overdue deadline both ready and runs the
deadline first; the load generator then reads what the connection holds before it closes the stream, and says how
late the close came (``close_lag_max_s``).

Made deterministic with a stub server in its own thread: it sends one token, has the client's loop block (as a
descheduled process would) and waits until it does, sends three more tokens while the loop is blocked, and holds the
stream open.  The block lasts past the request's 0.3 s timeout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web

from replay import ReplayOptions, replay_async
from replay_test_helpers import make_workload
from sim.workload.classes import RequestClass

TIMEOUT_S = 0.3
BLOCK_S = 0.6  # longer than the timeout: the block starts after the request was sent


def _chunk(i: int) -> bytes:
    # vLLM 0.32's completion chunk with per-chunk usage (as in test_open_loop_loadgen.py)
    return (f'data: {{"id":"cmpl-1","object":"text_completion","created":1,"model":"stub","choices":[{{"index":0,'
            f'"text":"","logprobs":null,"finish_reason":null,"stop_reason":null}}],"usage":{{"prompt_tokens":4,'
            f'"total_tokens":{4 + i},"completion_tokens":{i}}}}}\n\n').encode()


class _StubThread:
    """An aiohttp server on its own loop in a thread; ``client_loop`` is the replay's loop, which it blocks."""

    def __init__(self):
        self.client_loop: asyncio.AbstractEventLoop | None = None
        self.blocked = threading.Event()
        self.url: str | None = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _block_client(self) -> None:  # runs on the client's loop
        self.blocked.set()
        time.sleep(BLOCK_S)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def metrics(self, request):
        return web.Response(text="", content_type="text/plain")

    async def completions(self, request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk(1))
        await asyncio.sleep(0.02)  # the client reads the first token
        self.client_loop.call_soon_threadsafe(self._block_client)
        await asyncio.get_running_loop().run_in_executor(None, self.blocked.wait)
        for i in (2, 3, 4):  # delivered while the client's loop is blocked, before its deadline
            await resp.write(_chunk(i))
        for _ in range(3000):  # the stream stays open until the client's deadline closes the connection
            transport = request.transport
            if transport is None or transport.is_closing():
                break
            await asyncio.sleep(0.01)
        return resp

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start():
            app = web.Application()
            app.router.add_get("/v1/models", self.models)
            app.router.add_get("/metrics", self.metrics)
            app.router.add_post("/v1/completions", self.completions)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(30), "the stub server did not start"
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


@pytest.fixture(scope="module")
def drained():
    workload = make_workload([("impatient", 0.0, 4, 100)], {"impatient": RequestClass("impatient",
                                                                                      timeout_s=TIMEOUT_S)})

    async def run(stub: _StubThread):
        stub.client_loop = asyncio.get_running_loop()
        return await replay_async(stub.url, workload, ReplayOptions(sample_interval_wall_s=0))

    with _StubThread() as stub:
        return asyncio.run(run(stub))


def test_tokens_delivered_before_a_late_deadline_are_counted(drained):
    row = drained.requests.iloc[0]
    assert row["status"] == "timed_out"
    assert row["e2e_s"] == pytest.approx(TIMEOUT_S)  # censored at the deadline, however late the client closed
    # 1 read before the block, 3 delivered during it (without reading what the connection held: 1)
    assert row["generated_tokens"] == 4
    # Each token is stamped when it was read, the drained ones at the deadline at the latest: none after the row's end.
    times = drained.token_times[int(row["request_id"])]
    assert len(times) == 4
    assert times.max() <= row["arrival_s"] + row["e2e_s"] + 1e-9


def test_the_close_lag_is_reported(drained):
    # The loop was blocked from after the send until BLOCK_S later, past the deadline at TIMEOUT_S.
    lag = drained.info["close_lag_max_s"]
    assert BLOCK_S - TIMEOUT_S - 0.05 <= lag < BLOCK_S + 5.0
