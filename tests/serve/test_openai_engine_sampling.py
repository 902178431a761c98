"""The OpenAI engine adapter forwards the sampling controls (constraints, penalties, logit bias,
top logprobs) to its upstream, Parrot's own OpenAI-compatible server over the tiny engine: the
adapter gives what the builtin engine gives for the same request, and what it cannot ask is a 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import serve_app, start_tiny_engine

from parrot.backends.connect import connect_engine
from parrot.backends.openai_dialect import StopRule, choice_events, completion_body
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.engine_api import ExtendRequest, TokenEvent, TopLogprob
from parrot.protocol.engine_client import EngineClient
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import CallSpec, RegisterEngineRequest, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve import create_app, create_manager

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_model_folder: Path) -> Iterator[AsyncEngine]:
    engine = start_tiny_engine(tiny_model_folder)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def upstream_url(engine: AsyncEngine) -> Iterator[str]:
    with serve_app(create_app(create_manager([engine]), connect_engine=connect_engine)) as (url, _):
        yield url


async def generate(client: EngineClient, context_id: str, sampling: SamplingParams) -> list[TokenEvent]:
    req = ExtendRequest(context_id=context_id, token_ids=[5, 6, 7, 8, 9], sampling=sampling)
    return [e async for e in client.extend(req)]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=16, json_schema=SCHEMA),
        SamplingParams(max_tokens=8, regex="[xy]{4}"),
        SamplingParams(max_tokens=8, choices=["alpha", "beta"]),
        SamplingParams(max_tokens=6, ignore_eos=True, frequency_penalty=1.0, presence_penalty=0.5),
        SamplingParams(max_tokens=6, ignore_eos=True, repetition_penalty=1.5, logit_bias={42: 5.0}),
        SamplingParams(max_tokens=4, ignore_eos=True, top_logprobs=3),
    ],
    ids=["json_schema", "regex", "choices", "penalties", "repetition_bias", "top_logprobs"],
)
def test_the_adapter_gives_the_builtin_engines_output(
    engine: AsyncEngine, upstream_url: str, tiny_model_folder: Path, sampling: SamplingParams
) -> None:
    async def main() -> None:
        client = OpenAIEngineClient(upstream_url, api_key="k", tokenizer_folder=tiny_model_folder)
        name = f"{sampling.json_schema is not None}-{sampling.regex}-{sampling.top_logprobs}-{id(sampling)}"
        got, expected = await generate(client, f"a{name}", sampling), await generate(engine, f"b{name}", sampling)
        assert [e.token_id for e in got if e.token_id is not None] == [e.token_id for e in expected]
        assert "".join(e.text for e in got) == "".join(e.text for e in expected)
        if sampling.json_schema is not None:
            assert json.loads("".join(e.text for e in got)) in [{"ok": True}, {"ok": False}]
        if sampling.top_logprobs:
            tops = [[t.token_id for t in e.top_logprobs or []] for e in got if e.token_id is not None]
            assert tops == [[t.token_id for t in e.top_logprobs or []] for e in expected]
        await client.aclose()

    asyncio.run(main())


def test_the_dialect_sends_each_setting_and_refuses_what_it_cannot_ask() -> None:
    sampling = SamplingParams(
        presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1, logit_bias={7: -3.0}, regex="a+"
    )
    body = completion_body("m", [1], sampling, 4, ask_token_ids=True)
    sent = {k: body[k] for k in ("presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")}
    assert sent == {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
        "logit_bias": {"7": -3.0},
    }
    assert [body["structured_outputs"], body["logprobs"], "stream_interval" in body] == [{"regex": "a+"}, 0, False]
    assert completion_body("m", [1], sampling, 4, ask_token_ids=True, stream_interval=8)["stream_interval"] == 8
    with pytest.raises(ParrotError) as info:
        completion_body("m", [1], SamplingParams(top_logprobs=2), 4, ask_token_ids=False)
    assert [info.value.status, info.value.field] == [400, "sampling.top_logprobs"]
    chunk = {
        "text": "ab",
        "finish_reason": None,
        "logprobs": {
            "tokens": ["token_id:4", "token_id:5"],
            "token_logprobs": [-0.5, -1.0],
            "top_logprobs": [{"token_id:4": -0.5, "token_id:9": -0.7}, {"token_id:5": -1.0, "token_id:3": -0.1}],
        },
    }
    events = choice_events(chunk, None, StopRule(frozenset({2}), False), num_top=1)
    assert [e.top_logprobs for e in events] == [
        [TopLogprob(token_id=4, logprob=-0.5)],
        [TopLogprob(token_id=3, logprob=-0.1)],
    ]


def test_a_scored_select_over_an_engine_that_cannot_score_uses_the_choices_grammar(
    upstream_url: str, tiny_model_folder: Path
) -> None:
    # The adapter answers a scoring fill with 400 naming `score`: the call generates under the
    # choices grammar instead, and its value has no scores.
    async def main() -> None:
        client = OpenAIEngineClient(upstream_url, api_key="k", tokenizer_folder=tiny_model_folder)
        manager = create_manager([client])
        await manager.start()
        try:
            created = manager.create_session("k")
            session = manager.session(created.session_id, created.token)
            sampling = SamplingParams(max_tokens=8, choices=["alpha", "beta"], score_choices=True)
            spec = CallSpec(template="Pick one:{{output:v}}", sampling={"v": sampling})
            manager.submit(session, SubmitRequest(calls=[spec]))
            got = await manager.get_variable(session, "c0~v", timeout_s=60)
            assert [got.value in ["alpha", "beta"], got.scores] == [True, None]
        finally:
            await manager.stop()
            await client.aclose()

    asyncio.run(main())


def test_stream_interval_is_an_openai_engines_setting() -> None:
    req = RegisterEngineRequest(url="http://127.0.0.1:9", stream_interval=8)
    with pytest.raises(ParrotError) as info:
        asyncio.run(connect_engine(req, has_tokenizer=True))
    assert [info.value.status, info.value.field] == [400, "stream_interval"]
    assert OpenAIEngineClient("http://127.0.0.1:9", stream_interval=8).stream_interval == 8
