"""The twin as a server others point clients at: what vLLM rejects gets 400 (never 500 with a traceback), a body
limit holds, prompts are counted without amplifying, ``--api-key`` guards ``/v1`` as vLLM's does, and a client
that disconnects mid-stream leaves no traceback in the log."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest
from replay_test_helpers import GPU, MODEL

from replay.twin_engine import TwinEngine
from replay.twin_server import count_prompt_tokens, make_app
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"raw": text.decode(errors="replace")}


def _json(d) -> bytes:
    return json.dumps(d).encode()


@pytest.mark.parametrize("body, message", [
    ({"model": MODEL, "prompt": [1, 2], "stream": True, "stream_options": "yes"}, "stream_options"),
    ({"model": MODEL, "prompt": [1, 2], "stream": True, "stream_options": [1]}, "stream_options"),
    ({"model": MODEL, "prompt": ""}, "prompt cannot be empty"),
    ({"model": MODEL, "prompt": "   "}, "prompt cannot be empty"),
    ({"model": MODEL, "prompt": []}, "prompt cannot be empty"),
    ({"model": MODEL, "prompt": [5, -1, 7]}, "Token id -1 is out of vocabulary"),
    ({"model": MODEL, "prompt": [5, 10**9]}, "Token id 1000000000 is out of vocabulary"),
    ({"model": MODEL, "prompt": [1, 2], "stream": "maybe"}, "stream"),
    ({"model": MODEL, "prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": [1, 2], "temperature": [0.5]}, "temperature"),
])
def test_what_vllm_rejects_is_a_400(shared_twin, body, message):
    status, out = _post(shared_twin, _json(body))
    assert status == 400, out
    assert message in out["message"] and out["object"] == "error"


def test_deeply_nested_json_is_a_400(shared_twin):
    status, out = _post(shared_twin, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "nested too deeply" in out["message"]


def test_stream_false_as_a_string_is_false(shared_twin):
    # pydantic (vLLM's request models) reads "false" as False: a whole response, not an event stream.
    status, out = _post(shared_twin, _json({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2, "stream": "false",
                                            "temperature": "0.5"}))
    assert status == 200 and out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 2


def test_a_body_over_the_limit_is_refused(shared_twin):
    status, _ = _post(shared_twin, b'{"prompt": "' + b"a " * (5 * 2**20) + b'"}')
    assert status == 413


def test_text_prompts_are_counted_without_a_word_list():
    assert count_prompt_tokens("one  two\nthree\tfour") == 4
    assert count_prompt_tokens(["a b"]) == 2
    assert count_prompt_tokens([3, 4, 5], vocab_size=6) == 3
    with pytest.raises(ValueError, match="out of vocabulary"):
        count_prompt_tokens([3, 6], vocab_size=6)


def test_a_client_that_disconnects_mid_stream_leaves_no_traceback(shared_twin, tmp_path):
    host, port = shared_twin.removeprefix("http://").split(":")
    body = _json({"model": MODEL, "prompt": [1] * 32, "max_tokens": 2000, "stream": True,
                  "extra_body": None, "ignore_eos": True})
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert sock.recv(200).startswith(b"HTTP/1.1 200")
        # closed mid-stream
    status, out = _post(shared_twin, _json({"model": MODEL, "prompt": [1, 2], "max_tokens": 1}))
    assert status == 200  # still serving
    logs = list(tmp_path.parent.glob("twin*/twin-*.log"))
    assert logs  # the shared twin's log
    for log in logs:
        assert "Traceback" not in log.read_text(errors="replace")


def test_api_key_guards_v1_as_vllm_does():
    from aiohttp.test_utils import TestClient, TestServer

    engine = TwinEngine(EngineConfig.from_dict({"max_model_len": 4096}), load_model(MODEL), load_gpu(GPU), speed=50)

    async def scenario():
        app = make_app(engine, MODEL, api_key="s3cret")
        async with TestClient(TestServer(app)) as client:
            body = {"model": MODEL, "prompt": [1, 2], "max_tokens": 1}
            denied = await client.post("/v1/completions", json=body)
            wrong = await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
            ok = await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
            health = await client.get("/health")
            return denied.status, await denied.json(), wrong.status, ok.status, health.status

    denied, payload, wrong, ok, health = asyncio.run(scenario())
    assert (denied, wrong, ok, health) == (401, 401, 200, 200)
    assert payload == {"error": "Unauthorized"}
