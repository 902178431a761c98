"""/v1/completions in vLLM's dialect (what the OpenAI engine adapter asks of an upstream): token-id
prompts, `logprobs: 0` with `return_tokens_as_token_ids`, `stop_token_ids`; checked token by token
against the engine run directly on the same ids."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from live_server import LiveServer

from parrot.protocol.engine_api import ExtendRequest, FreeContextRequest, TokenEvent
from parrot.protocol.engine_client import extend_only
from parrot.protocol.sampling import SamplingParams
from parrot.text import Tokenizer

KEY = {"Authorization": "Bearer k"}


def direct_events(server: LiveServer, token_ids: list[int], sampling: SamplingParams) -> list[TokenEvent]:
    async def go() -> list[TokenEvent]:
        engine = server.engine.engine
        context_id = f"oracle-{uuid.uuid4().hex}"
        await extend_only(engine, ExtendRequest(context_id=context_id, token_ids=token_ids))
        events = [e async for e in engine.extend(ExtendRequest(context_id=context_id, append=True, sampling=sampling))]
        await engine.free(FreeContextRequest(context_id=context_id))
        return events

    return list(server.call(go()))


def stream_chunks(http: httpx.Client, body: dict) -> list[dict]:
    chunks = []
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}, headers=KEY) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_token_id_prompt_streams_token_ids_and_logprobs(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    ids = tok.encode("The capital of France is")
    expected = direct_events(server, ids, SamplingParams(max_tokens=6, ignore_eos=True))
    expected_ids = [e.token_id for e in expected]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        chunks = stream_chunks(http, body | {"return_tokens_as_token_ids": True})
        choices = [c["choices"][0] for c in chunks]
        assert "".join(c["text"] for c in choices) == "".join(e.text for e in expected)
        tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
        assert tokens == [f"token_id:{t}" for t in expected_ids]
        logprobs = [lp for c in choices if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]]
        assert logprobs == pytest.approx([e.logprob for e in expected], abs=1e-4)
        top = [d for c in choices if c["logprobs"] for d in c["logprobs"]["top_logprobs"]]
        assert [list(d) for d in top] == [[t] for t in tokens]  # logprobs=0: the sampled token only
        assert choices[-1]["finish_reason"] == "length"
        # Every chunk's tokens come no later than their text (the text may lag, never lead).
        num_tokens = 0
        for c in choices:
            num_tokens += len(c["logprobs"]["tokens"]) if c["logprobs"] else 0
            text_so_far = "".join(x["text"] for x in choices[: choices.index(c) + 1])
            assert tok.decode(expected_ids[:num_tokens]).startswith(text_so_far)

        # Not streamed, tokens as text: the same tokens, offsets into the text.
        got = http.post("/v1/completions", json=body | {"prompt": [ids]}, headers=KEY)
        assert got.status_code == 200, got.text
        choice = got.json()["choices"][0]
        pieces = [tok.decode([t], skip_special_tokens=False) for t in expected_ids]
        assert choice["logprobs"]["tokens"] == pieces
        assert choice["logprobs"]["text_offset"] == [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        assert choice["text"] == "".join(e.text for e in expected)
        assert got.json()["usage"]["prompt_tokens"] == len(ids)


def test_stop_token_ids_end_the_output_with_that_token(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    ids = tok.encode("Once upon a time")
    expected = [e.token_id for e in direct_events(server, ids, SamplingParams(max_tokens=8, ignore_eos=True))]
    # The first token that is new after the first one: the output ends there, that token included.
    k = next(i for i in range(1, len(expected)) if expected[i] not in expected[:i])
    stop_id = expected[k]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0, "stop_token_ids": [stop_id]}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        chunks = stream_chunks(http, body | {"logprobs": 0, "return_tokens_as_token_ids": True})
    choices = [c["choices"][0] for c in chunks]
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert tokens == [f"token_id:{t}" for t in expected[: k + 1]]
    assert "".join(c["text"] for c in choices) == tok.decode(expected[: k + 1])
    assert choices[-1]["finish_reason"] == "stop"


def test_bad_token_prompts_and_logprobs_are_refused_naming_the_field(server: LiveServer) -> None:
    body = {"model": "tiny", "max_tokens": 2}
    vocab_size = Tokenizer(server.engine.model_folder).vocab_size
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for prompt in ([-1], [vocab_size], [[1], [2]], []):
            got = http.post("/v1/completions", json=body | {"prompt": prompt}, headers=KEY)
            assert [got.status_code, got.json()["error"]["field"]] == [400, "prompt"], (prompt, got.text)
        for logprobs in (21, -1, True):  # 0..20 alternatives (OpenAI's limit); a count, not a flag
            got = http.post("/v1/completions", json=body | {"prompt": [1, 2], "logprobs": logprobs}, headers=KEY)
            assert [got.status_code, got.json()["error"]["field"]] == [400, "logprobs"], logprobs
        cards = http.get("/v1/models", headers=KEY).json()["data"]
        assert [(c["id"], c["max_model_len"]) for c in cards] == [("tiny", 4096)]
