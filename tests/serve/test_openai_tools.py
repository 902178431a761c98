"""Tools on /v1/chat/completions with the official `openai` client: tool_choice required and
named return `tool_calls` in OpenAI's format (streaming and not), tool results in the history
reach the prompt, and tool calls are read back from text (Hermes-style tags)."""

from __future__ import annotations

import json

import openai
import pytest
from live_server import LiveServer

from parrot.text import Tokenizer
from parrot.text.tools import parse_tool_calls, plain_messages, streamable_len, tool_call_schema

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_required_tool_choice_returns_a_valid_call(client: openai.OpenAI, seed: int) -> None:
    got = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=40,
        seed=seed,  # type: ignore[list-item]
    )
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert (call.function.name, args) in [
        ("get_time", {}),
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]


def test_named_tool_choice_streamed_and_not(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = {
        "model": "tiny",
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": named,
        "max_tokens": 40,
        "temperature": 0,
    }
    got = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    call = (got.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ["Paris", "Oslo"]
    chunks = list(client.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
    deltas = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []]
    assert [[d.index, d.function.name, d.function.arguments] for d in deltas] == [
        [0, "get_weather", call.function.arguments]
    ]
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]


def test_tool_results_in_the_history_reach_the_prompt(server: LiveServer, client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    kw = {"model": "tiny", "messages": history, "tools": [WEATHER], "max_tokens": 3, "temperature": 0}
    got = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    streamed = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    assert streamed[-1].usage is not None and streamed[-1].usage.prompt_tokens == got.usage.prompt_tokens  # type: ignore[union-attr]
    tok = Tokenizer(server.engine.model_folder)
    prompt = tok.apply_chat_template(history, add_generation_prompt=True, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>" in prompt
    assert '"name": "get_weather"' in prompt.split("<|im_end|>")[0]  # the tools, in the system message
    assert got.usage is not None and got.usage.prompt_tokens == len(tok.encode(prompt))


def test_auto_tool_choice_streams_content_as_it_comes(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "messages": ASK, "tools": [WEATHER], "max_tokens": 8, "temperature": 0}
    got = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    assert [got.choices[0].message.tool_calls, got.choices[0].finish_reason] == [None, "length"]
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True}))  # type: ignore[call-overload]
    contents = [ch.delta.content for c in chunks for ch in c.choices if ch.delta.content]
    assert "".join(contents) == got.choices[0].message.content
    assert len(contents) > 1  # streamed, not held to the end


def test_streamed_content_stops_at_a_tool_call_tag() -> None:
    assert [streamable_len(t) for t in ["Hi", "Hi <tool", "Hi <tool_call>{", "a<", "<x"]] == [2, 3, 3, 1, 2]


def test_tool_choice_errors_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},  # type: ignore[list-item, typeddict-item]
        )
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            response_format={"type": "json_object"},  # type: ignore[list-item]
        )
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_tool_calls_are_read_from_text() -> None:
    names = {"get_weather", "get_time"}
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert parse_tool_calls(text, names) == ("Let me check.", [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")])
    assert parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', names) == (
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        [],
    )
    assert parse_tool_calls("plain answer", names) == ("plain answer", [])


def test_tools_are_described_and_forced_calls_have_a_schema() -> None:
    messages = plain_messages([{"role": "system", "content": "Be brief."}], [WEATHER])
    assert messages[0]["content"].startswith("Be brief.\n\nYou may call functions")
    assert json.dumps(WEATHER) in messages[0]["content"]
    schema = tool_call_schema([WEATHER["function"], TIME["function"]])  # type: ignore[list-item]
    assert [o["properties"]["name"] for o in schema["anyOf"]] == [{"const": "get_weather"}, {"const": "get_time"}]
