"""Tool calling and structured output through LangChain on Parrot, against the real manager with the
in-memory fake engine scripted to reply as a constrained model would (the builtin engine's
constrained decoding is tested in tests/frontend/test_constrained_sdk.py): a tool-calling agent
loop, and replies parsed into pydantic models. The replies' JSON schemas reach the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from langchain_core.caches import InMemoryCache
from langchain_core.globals import set_llm_cache
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.tools import tool
from live_server import serve_app
from pydantic import BaseModel

from parrot.backends.connect import connect_engine
from parrot.frontend import ParrotError, Session
from parrot.integrations.langchain import ChatParrot
from parrot.protocol.engine_api import ExtendRequest, TokenEvent
from parrot.protocol.sampling import SamplingParams
from parrot.serve import create_app, create_manager


class Person(BaseModel):
    name: str
    age: int


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny, 21 C in {city}"


def scripted(prompt: str) -> str:
    """Replies as a model constrained to the request's schema would."""
    if "Result of get_weather:" in prompt:
        return '{"tool": "none", "answer": "It is sunny in Paris."}'
    if "weather" in prompt:
        return '{"tool": "get_weather", "arguments": {"city": "Paris"}}'
    if "Ada" in prompt:
        return '{"name": "Ada", "age": 36}'
    return "not json"


class RecordingFake(FakeEngine):
    """The fake engine, keeping every generation's sampling settings and prompt."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, responder=self.respond)
        self.requests: list[tuple[SamplingParams, str]] = []

    def respond(self, prompt: str) -> str:
        self.requests[-1] = (self.requests[-1][0], prompt)
        return scripted(prompt)

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        if req.sampling is not None:
            self.requests.append((req.sampling, ""))
        async for event in super().extend(req):
            yield event


@contextmanager
def fake_server(folder: Path) -> Iterator[tuple[str, RecordingFake]]:
    engine = RecordingFake(folder)
    with serve_app(create_app(create_manager([engine]), connect_engine=connect_engine)) as (url, _):
        yield url, engine


def test_a_tool_calling_agent_loop(default_model_folder: Path) -> None:
    with fake_server(default_model_folder) as (url, engine), Session(url) as s:
        model = ChatParrot(session=s, max_tokens=64).bind_tools([get_weather])
        messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
        for _ in range(3):
            reply = model.invoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                break
            messages += [get_weather.invoke(call) for call in reply.tool_calls]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    call = messages[1].tool_calls[0]  # type: ignore[attr-defined]
    assert [call["name"], call["args"], call["id"]] == ["get_weather", {"city": "Paris"}, f"call_{s.core.key}_v0"]
    assert [messages[2].content, messages[3].content] == ["sunny, 21 C in Paris", "It is sunny in Paris."]
    (first, first_prompt), (second, second_prompt) = engine.requests
    assert first.json_schema == second.json_schema
    assert first.json_schema is not None
    branches = first.json_schema["anyOf"]
    assert [b["properties"]["tool"] for b in branches] == [{"enum": ["get_weather"]}, {"enum": ["none"]}]
    assert branches[0]["properties"]["arguments"]["properties"] == {"city": {"type": "string"}}
    assert first_prompt.startswith("<|im_start|>system\nYou can call these tools:\n- get_weather: The weather")
    assert second_prompt.endswith(
        '<|im_start|>assistant\n{"tool": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>\n'
        "<|im_start|>tool\nResult of get_weather: sunny, 21 C in Paris<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_choice_narrows_the_schema_and_a_bad_one_is_refused(default_model_folder: Path) -> None:
    with fake_server(default_model_folder) as (url, engine), Session(url) as s:
        forced = ChatParrot(session=s).bind_tools([get_weather], tool_choice="get_weather")
        assert forced.invoke("weather in Paris?").tool_calls[0]["args"] == {"city": "Paris"}  # type: ignore[attr-defined]
        plain = ChatParrot(session=s).bind_tools([get_weather], tool_choice="none").invoke("Ada?")
        with pytest.raises(ValueError, match="tool_choice 'nope' is no bound tool"):
            ChatParrot(session=s).bind_tools([get_weather], tool_choice="nope")
    schema = engine.requests[0][0].json_schema
    assert schema is not None and schema["properties"]["tool"] == {"enum": ["get_weather"]}
    assert [plain.content, engine.requests[1][0].json_schema] == ['{"name": "Ada", "age": 36}', None]


def test_structured_output_is_constrained_and_parsed(default_model_folder: Path) -> None:
    with fake_server(default_model_folder) as (url, engine), Session(url) as s:
        lazy = ChatParrot(session=s, lazy=True)
        assert lazy.with_structured_output(Person).invoke("Who is Ada?") == Person(name="Ada", age=36)
        raw = ChatParrot(session=s).with_structured_output(Person, include_raw=True).invoke("Who?")
        as_dict = asyncio.run(ChatParrot(session=s).with_structured_output(Person.model_json_schema()).ainvoke("Ada"))
        with pytest.raises(ParrotError, match="the output is not a valid Person") as info:
            ChatParrot(session=s).with_structured_output(Person).invoke("Who?")
    assert info.value.status == 502
    assert [raw["raw"].content, raw["parsed"], type(raw["parsing_error"])] == ["not json", None, ParrotError]
    assert as_dict == {"name": "Ada", "age": 36}
    assert [r[0].json_schema for r in engine.requests] == [Person.model_json_schema()] * 4


def test_bad_model_arguments_name_the_field(default_model_folder: Path) -> None:
    with fake_server(default_model_folder) as (url, _), Session(url) as s:
        with pytest.raises(ParrotError, match="takes no argument 'colour'") as info:
            ChatParrot(session=s).invoke("hi", colour="red")
        assert info.value.field == "colour"
        with pytest.raises(ParrotError, match="sampling setting 'temperature'") as info:
            ChatParrot(session=s, temperature=-1.0).invoke("hi")
        assert info.value.field == "langchain.with_sampling.temperature"
        result: Any = ChatParrot(session=s, max_tokens=3).invoke("hi")
        assert result.content == "not json"


def test_a_global_llm_cache_never_replays_a_lazy_reply(default_model_folder: Path) -> None:
    set_llm_cache(InMemoryCache())
    try:
        with fake_server(default_model_folder) as (url, engine), Session(url) as s:
            lazy = ChatParrot(session=s, lazy=True)
            first, second = lazy.invoke("hi"), lazy.invoke("hi")
            assert [first.content, second.content] == [f"\ue000parrot:{s.core.key}/v{i}\ue001" for i in (0, 1)]
            assert [lazy.resolve(first.content), lazy.resolve(second.content)] == ["not json", "not json"]
        assert len(engine.requests) == 2
    finally:
        set_llm_cache(None)
