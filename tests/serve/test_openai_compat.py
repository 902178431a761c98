"""OpenAI-compatible routes, driven by the official `openai` client against a real uvicorn server;
every text is checked against the engine run directly on the same token ids."""

from __future__ import annotations

import httpx
import openai
import pytest
from live_server import LiveServer

from parrot.protocol.sampling import SamplingParams
from parrot.text import Tokenizer


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion_matches_the_engine_and_reports_usage(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "The capital of France is"
    ids = tok.encode(prompt)
    expected = server.direct_generate(ids, SamplingParams(max_tokens=5, temperature=0.0))
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    assert got.choices[0].text == expected
    assert got.choices[0].finish_reason == "length"
    assert got.usage is not None
    assert [got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens] == [len(ids), 5, len(ids) + 5]
    assert got.usage.prompt_tokens_details is not None
    assert got.usage.prompt_tokens_details.cached_tokens == 0
    assert got.model == "tiny"

    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_stop_strings_cut_the_text(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "Once upon a time"
    full = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=8, temperature=0.0))
    stop = full[len(full) // 2 :][:3]
    assert stop.strip(), full
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stop=[stop])
    assert got.choices[0].text == full[: full.index(stop)]
    assert got.choices[0].finish_reason == "stop"


def test_chat_completion_stream_and_usage(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(prompt)
    expected = server.direct_generate(ids, SamplingParams(max_tokens=6, temperature=0.0))
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == expected
    assert got.usage is not None and got.usage.prompt_tokens == len(ids)

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_completion_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert [chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens] == [len(ids), 6]


def test_unsupported_options_are_refused_by_name(server: LiveServer, client: openai.OpenAI) -> None:
    blocks_free = server.stats().num_blocks_free
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", suffix="y")
    assert info.value.body["param"] == "suffix"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", best_of=3)
    assert info.value.body["param"] == "best_of"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="word " * 5000, max_tokens=4)
    assert "exceed the model's context of 4096 tokens" in info.value.body["message"]  # type: ignore[index]
    assert server.manager.sessions.sessions == {}  # one-call sessions are gone
    assert server.wait_blocks_free(blocks_free).num_blocks_free == blocks_free


def test_a_client_leaving_mid_stream_frees_the_context(server: LiveServer) -> None:
    blocks_free = server.wait_blocks_free(server.stats().num_blocks_total).num_blocks_free
    body = {"model": "tiny", "prompt": "Count to a thousand:", "max_tokens": 300, "stream": True}
    with (
        httpx.Client(base_url=server.url) as http,
        http.stream("POST", "/v1/completions", json=body, headers={"Authorization": "Bearer k"}) as resp,
    ):
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert '"object":"text_completion"' in first
    # The server notices the disconnect, deletes the one-call session, frees the context once the
    # engine has finished the generation.
    deadline_blocks = server.wait_blocks_free(blocks_free, timeout_s=60)
    assert deadline_blocks.num_blocks_free == blocks_free
    assert server.manager.sessions.sessions == {}


def test_vllm_style_extensions_ignore_eos_and_top_k(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "Once upon a time"
    expected = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=24, ignore_eos=True))
    got = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True, "top_k": 1}
    )
    assert got.choices[0].text == expected
    assert got.usage is not None
    assert got.usage.completion_tokens == 24
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=4, extra_body={"top_k": -1})


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"stop": [""]}, "stop"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
        ({"stop": ["x" * 300]}, "stop"),
        ({"seed": 2**63}, "seed"),
        ({"n": 65}, "n"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}, "response_format"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ],
)
def test_sampling_outside_the_limits_is_a_400_naming_the_field(
    server: LiveServer, extra: dict[str, object], field: str
) -> None:
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, **extra}
    for route, payload in (
        ("/v1/completions", body),
        ("/v1/chat/completions", {**body, "prompt": None, "messages": [{"role": "user", "content": "Hi"}]}),
    ):
        payload = {k: v for k, v in payload.items() if v is not None}
        resp = httpx.post(server.url + route, json=payload, headers={"Authorization": "Bearer k"}, timeout=30)
        assert [resp.status_code, resp.json()["error"]["field"].split(".")[0]] == [400, field], resp.text
