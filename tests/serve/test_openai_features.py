"""The OpenAI routes' full options, driven by the official `openai` client against a real server
on the tiny engine (streaming and not): `n`, logprobs, echo, penalties, logit_bias,
response_format, structured_outputs. Texts are checked against the engine run directly."""

from __future__ import annotations

import json

import openai
import pytest
from live_server import LiveServer

from parrot.protocol.sampling import SamplingParams
from parrot.text import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)


def test_n_choices_fork_one_filled_prompt(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "A parrot named Polly lives in a very tall tree by the river, where every morning she " * 3
    ids = tok.encode(prompt)
    assert len(ids) > 32  # ManagerConfig.sharing.min_prefix_tokens: shorter prompts are filled per choice
    expected = server.direct_generate(ids, SamplingParams(max_tokens=6, ignore_eos=True))
    server.clear_prefix_cache()
    before, num_logged = server.stats().num_prefill_tokens, len(server.engine.log)
    got = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=0, n=4, extra_body={"ignore_eos": True}
    )
    # One fill of the prompt but its last token (the shared prefix), then 4 generations forking it,
    # each carrying the last token; the engine computed the prompt once, not 4 times.
    requests = [[op, n] for _, op, _, n in server.engine.log[num_logged:] if op in ("fill", "generate")]
    assert requests == [["fill", len(ids) - 1]] + [["generate", 0]] * 4
    assert server.stats().num_prefill_tokens - before < 2 * len(ids)
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert [c.text for c in got.choices] == [expected] * 4
    assert got.usage is not None
    assert [got.usage.prompt_tokens, got.usage.completion_tokens] == [len(ids), 24]

    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=0, n=2, stream=True, extra_body={"ignore_eos": True}
    )
    texts = ["", ""]
    finishes: list[str] = []
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert texts == [expected, expected]
    assert finishes == ["length", "length"]


def test_seeded_choices_differ_and_the_first_is_the_request_alone(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "prompt": "Once", "max_tokens": 8, "temperature": 1.0, "seed": 11}
    alone = client.completions.create(**kw, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    three = client.completions.create(**kw, n=3, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    assert three.choices[0].text == alone.choices[0].text
    assert len({c.text for c in three.choices}) == 3


def test_completion_logprobs_hold_the_alternatives(server: LiveServer, client: openai.OpenAI) -> None:
    got = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=5, temperature=0, logprobs=3, extra_body={"ignore_eos": True}
    )
    lp = got.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == 5
    assert "".join(lp.tokens) == got.choices[0].text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob
        assert max(top.values()) == logprob  # greedy: the sampled token is the most likely
        assert 1 <= len(top) <= 3
    stream = client.completions.create(
        model="tiny",
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        logprobs=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    streamed = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens or []] == lp.tokens
    assert [t for s in streamed for t in s.top_logprobs or []] == lp.top_logprobs


def test_chat_logprobs_and_top_logprobs_streamed_and_not(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Say hi"}]
    kw = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True}
    got = client.chat.completions.create(**kw, top_logprobs=2, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    content = got.choices[0].logprobs.content
    assert len(content) == 4
    assert "".join(t.token for t in content) == got.choices[0].message.content
    for t in content:
        assert [len(t.top_logprobs), t.top_logprobs[0].token, t.top_logprobs[0].logprob] == [2, t.token, t.logprob]
        assert t.bytes == list(t.token.encode())
    stream = client.chat.completions.create(**kw, top_logprobs=2, stream=True, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs for t in c.logprobs.content or []]
    assert [[t.token, t.logprob] for t in streamed] == [[t.token, t.logprob] for t in content]


def test_echo_prepends_the_prompt(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "The sky is"
    expected = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=4, ignore_eos=True))
    kw = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True}
    got = client.completions.create(**kw, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    assert got.choices[0].text == prompt + expected
    stream = client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in stream if c.choices) == prompt + expected


def test_stream_interval_sends_that_many_tokens_per_chunk(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "The sky is"
    expected = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=10, ignore_eos=True))
    kw = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True, "logprobs": 0}
    extra = {"ignore_eos": True, "stream_interval": 4, "return_tokens_as_token_ids": True}
    chunks = [c.choices[0] for c in client.completions.create(**kw, extra_body=extra) if c.choices]  # type: ignore[call-overload]
    # vLLM's extension: 4 + 4 + the last 2 tokens (after the opening chunk, before the finish).
    sizes = [len(c.logprobs.tokens) for c in chunks if c.logprobs is not None and c.logprobs.tokens]
    assert sizes == [4, 4, 2]
    assert "".join(c.text for c in chunks) == expected
    with pytest.raises(openai.BadRequestError, match="stream_interval"):
        client.completions.create(**kw, extra_body={"stream_interval": 0})  # type: ignore[call-overload]


def test_echo_with_logprobs_scores_the_prompt(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    kw = {"model": "tiny", "max_tokens": 4, "temperature": 0, "logprobs": 2, "extra_body": extra}
    first = client.completions.create(prompt="The sky is", **kw)  # type: ignore[call-overload]
    lp1 = first.choices[0].logprobs
    assert lp1 is not None and lp1.tokens is not None and lp1.token_logprobs is not None
    # The prompt and its greedy output, echoed: the output's tokens are scored as prompt tokens.
    ids = tok.encode("The sky is") + [int(t.removeprefix("token_id:")) for t in lp1.tokens]
    n = len(ids)
    got = client.completions.create(prompt=ids, echo=True, **kw)  # type: ignore[call-overload]
    lp = got.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert lp.tokens[:n] == [f"token_id:{t}" for t in ids]
    assert len(lp.tokens) == n + 4
    assert [lp.token_logprobs[0], lp.top_logprobs[0], lp.text_offset[0]] == [None, None, 0]
    assert lp.token_logprobs[n - 4 : n] == pytest.approx(lp1.token_logprobs, abs=1e-4)
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert top[token] == logprob and 1 <= len(top) <= 3
    assert lp.text_offset[n] == len(tok.decode(ids))
    assert got.choices[0].text.startswith(tok.decode(ids))
    assert got.usage is not None and got.usage.prompt_tokens == n
    stream = client.completions.create(prompt=ids, echo=True, stream=True, **kw)  # type: ignore[call-overload]
    parts = [c.choices[0] for c in stream if c.choices]
    assert "".join(p.text for p in parts) == got.choices[0].text
    assert [t for p in parts if p.logprobs for t in p.logprobs.tokens or []] == lp.tokens
    assert [x for p in parts if p.logprobs for x in p.logprobs.token_logprobs or []] == lp.token_logprobs


def test_penalties_and_logit_bias_match_the_engine(server: LiveServer, client: openai.OpenAI) -> None:
    tok = Tokenizer(server.engine.model_folder)
    prompt = "Once upon a time there was"
    params = {"presence_penalty": 0.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3}
    expected = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=10, ignore_eos=True, **params))
    plain = server.direct_generate(tok.encode(prompt), SamplingParams(max_tokens=10, ignore_eos=True))
    got = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=1.0,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.3},
    )
    assert got.choices[0].text == expected
    assert expected != plain
    stream = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=1.0,
        stream=True,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.3},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected
    forced = tok.encode(" parrot")[0]
    biased = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert biased.choices[0].text == tok.decode([forced] * 3)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced): 100},
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == tok.decode([forced] * 3)


def _valid(value: object) -> bool:
    return (
        isinstance(value, dict)
        and sorted(value) == ["ok", "size"]
        and isinstance(value["ok"], bool)
        and value["size"] in ["S", "M", "L"]
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_response_format_json_schema_parses_and_validates(client: openai.OpenAI, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "shirt", "schema": SCHEMA, "strict": True}}
    messages = [{"role": "user", "content": "A shirt?"}]
    kw = {"model": "tiny", "messages": messages, "max_tokens": 40, "temperature": 1.0, "seed": seed}
    got = client.chat.completions.create(**kw, response_format=fmt)  # type: ignore[call-overload]
    assert _valid(json.loads(got.choices[0].message.content))
    assert got.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(**kw, response_format=fmt, stream=True)  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == got.choices[0].message.content


def test_json_object_and_structured_outputs(server: LiveServer, client: openai.OpenAI) -> None:
    got = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert got.choices[0].text in ["red", "green", "blue"]
    stream = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == got.choices[0].text
    regex = client.completions.create(
        model="tiny",
        prompt="Code:",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[A-Z]{2}[0-9]{3}"}},
    )
    assert len(regex.choices[0].text) == 5
    assert regex.choices[0].text[:2].isupper() and regex.choices[0].text[2:].isdigit()
    # json_object: the grammar lets the biased "{}" end the object at once (the tiny model's own
    # choices would fill max_tokens before closing an object).
    tok = Tokenizer(server.engine.model_folder)
    bias = {str(t): 100 for t in {*tok.encode("{}"), *tok.encode("}")}}
    obj = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "{}"}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_object"},
        logit_bias=bias,
    )
    assert [obj.choices[0].finish_reason, json.loads(obj.choices[0].message.content or "")] == ["stop", {}]
