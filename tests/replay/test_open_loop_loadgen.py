"""The load generator is open loop: each request is sent at its trace arrival time however slow the server is,
and latencies count from that time (no coordinated omission).  Checked against a stub server that serves one
request at a time, with vLLM-style chunks (without per-chunk usage) and errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from replay import ReplayOptions, replay_async
from replay_test_helpers import make_workload
from sim.workload.classes import RequestClass

SERVICE_S = 0.15  # the stub serves one request at a time, each taking this long


class Stub:
    def __init__(self):
        self.received: dict[int, float] = {}
        self.lock = asyncio.Lock()
        self.generated = 0

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model", "max_model_len": 2048}]})

    async def metrics(self, request):
        text = (
            "# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{model_name="stub"}} {self.generated}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="stub"}} {int(self.lock.locked())}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def completions(self, request):
        body = await request.json()
        n_prompt = len(body["prompt"])
        self.received[n_prompt] = time.monotonic()
        assert body["stream"] and body["ignore_eos"] and body["model"] == "stub"
        if n_prompt == 7:
            return web.json_response({"object": "error", "message": "too long", "code": 400}, status=400)
        if n_prompt == 8:
            return web.json_response({"object": "error", "message": "boom", "code": 500}, status=500)
        if n_prompt == 9:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n')
            return resp  # the stream ends without a finish reason
        async with self.lock:
            await asyncio.sleep(SERVICE_S)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = body["max_tokens"]
            for i in range(n):
                reason = '"length"' if i == n - 1 else "null"
                chunk = f'data: {{"choices":[{{"index":0,"text":"x","finish_reason":{reason}}}]}}\n\n'
                await resp.write(chunk.encode())
                self.generated += 1
            await resp.write(b"data: [DONE]\n\n")
            return resp


@pytest.fixture(scope="module")
def stub_run():
    async def run():
        stub = Stub()
        app = web.Application()
        app.router.add_get("/v1/models", stub.models)
        app.router.add_get("/metrics", stub.metrics)
        app.router.add_post("/v1/completions", stub.completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        # Ten requests 20 ms apart (prompt lengths 10..19 identify them), and three that fail in different ways.
        rows = [("c", 0.02 * i, 10 + i, 3) for i in range(10)]
        rows += [("c", 0.05, 7, 3), ("c", 0.06, 8, 3), ("c", 0.07, 9, 3)]
        workload = make_workload(rows, {"c": RequestClass("c")})
        try:
            result = await replay_async(url, workload, ReplayOptions(sample_interval_wall_s=0.05))
        finally:
            await runner.cleanup()
        return stub, result, workload

    return asyncio.run(run())


def test_sends_at_arrival_times_regardless_of_the_server(stub_run):
    stub, result, workload = stub_run
    t0 = min(stub.received.values())
    for _, row in workload.requests.iterrows():
        late = stub.received[row.prompt_tokens] - t0 - row.arrival_s
        assert abs(late) < 0.03, (row.prompt_tokens, late)  # all sent while the stub was still busy
    assert result.info["send_lag_max_s"] < 0.03


def test_latency_counts_from_the_intended_arrival(stub_run):
    _, result, _ = stub_run
    ok = result.requests[result.requests["status"] == "finished"].sort_values("arrival_s")
    assert len(ok) == 10
    # Served one at a time: the k-th request waits for k-1 others, and that wait is in its TTFT.
    k = ok["first_token_s"].rank().to_numpy()
    expected = SERVICE_S * k - ok["arrival_s"].to_numpy()
    assert ok["ttft_s"].to_numpy() == pytest.approx(expected, abs=0.06)
    assert (ok["generated_tokens"] == 3).all()  # counted per chunk when the server sends no usage


def test_errors_become_statuses(stub_run):
    _, result, _ = stub_run
    status = dict(zip(result.requests["prompt_tokens"], result.requests["status"]))
    assert (status[7], status[8], status[9]) == ("rejected", "unfinished", "unfinished")
    errors = dict(result.info["errors"])
    assert any("HTTP 500" in e for e in errors.values())
    assert any("without a finish reason" in e for e in errors.values())


def test_timeline_from_metrics_samples(stub_run):
    _, result, _ = stub_run
    steps = result.steps
    assert len(steps) >= 5
    assert steps["decode_tokens"].sum() == 30
    assert steps["num_steps"].isna().all()  # the stub exports no iteration histogram: unknown, not 0
    assert (steps["duration_s"] > 0).any()
