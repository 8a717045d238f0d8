"""The twin speaks vLLM's OpenAI-compatible API: its responses and stream chunks parse with the OpenAI client."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from replay_test_helpers import MODEL


@pytest.fixture(scope="module")
def client(shared_twin):
    return openai.OpenAI(base_url=shared_twin + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_model(client, shared_twin):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    raw = json.load(urllib.request.urlopen(shared_twin + "/v1/models"))
    assert raw["data"][0]["max_model_len"] == 4096  # vLLM reports it; the load generator clips max_tokens by it


def test_completion_with_token_id_prompt(client):
    out = client.completions.create(model=MODEL, prompt=list(range(1000, 1100)), max_tokens=7,
                                    extra_body={"ignore_eos": True})
    assert out.object == "text_completion"
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert choice.text.count("tok") == 7
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (100, 7, 107)


def test_streaming_chunks_parse(client):
    stream = client.completions.create(
        model=MODEL, prompt=[5] * 64, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 12
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 11 + ["length"]
    assert all(c.id == chunks[0].id and c.model == MODEL for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_text_prompt_and_default_max_tokens(client):
    out = client.completions.create(model=MODEL, prompt="one two three four")
    assert out.usage.prompt_tokens == 4
    assert out.usage.completion_tokens == 16  # the OpenAI/vLLM default for completions


def test_errors_are_vllm_shaped(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096"):
        client.completions.create(model=MODEL, prompt=[1] * 4000, max_tokens=200)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=[1, 2], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="priority"):
        client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2, extra_body={"priority": 3})


def test_health_and_version(shared_twin):
    assert urllib.request.urlopen(shared_twin + "/health").status == 200
    assert "version" in json.load(urllib.request.urlopen(shared_twin + "/version"))
