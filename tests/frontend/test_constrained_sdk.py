"""Constrained and typed outputs end to end on the builtin engine (the tiny random model): the text
matches the regex, is one of the choices, parses into the pydantic model; through LangChain,
structured output and tool calls parse. Only constrained decoding can make a random model do this,
so these tests pass once the engine honours `regex`, `choices` and `json_schema` (a parallel
branch); the SDK's side of them is tested without the engine in test_inputs_outputs.py and
tests/integrations/test_langchain_tools.py."""

from __future__ import annotations

import re

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from live_server import LiveServer
from pydantic import BaseModel, Field

from parrot.frontend import Input, Output, Session, select, semantic_function
from parrot.integrations.langchain import ChatParrot


class Person(BaseModel):  # bounded, so a random model's JSON ends within max_tokens
    name: str = Field(max_length=12)
    adult: bool


class City(BaseModel):
    city: str = Field(max_length=16)


@semantic_function
def profile(
    text: Input,
    phone: Output = Output(regex=r"[0-9]{3}-[0-9]{4}", max_tokens=16),  # noqa: B008
    verdict: Output = select(["yes", "no", "maybe"]),  # noqa: B008
    person: Output = Output(schema=Person, max_tokens=200),  # noqa: B008
):
    """Text: {{input:text}}
    Phone:{{output:phone}}
    Adult?{{output:verdict}}
    Person:{{output:person}}"""


@tool(args_schema=City)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_regex_choices_and_typed_outputs(server: LiveServer) -> None:
    with Session(server.url):
        phone, verdict, person = profile("Ada, 36, call 555-0101")
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", phone.get())
        assert verdict.get() in ["yes", "no", "maybe"]
        assert isinstance(person.get(), Person)
        samples = profile.samples(3, "Bob")
        assert all(re.fullmatch(r"[0-9]{3}-[0-9]{4}", p.get()) for p, _, _ in samples)


def test_langchain_structured_output_and_tool_calls(server: LiveServer) -> None:
    with Session(server.url) as s:
        structured = ChatParrot(session=s, lazy=True, max_tokens=200).with_structured_output(Person)
        assert isinstance(structured.invoke("Who is Ada?"), Person)
        model = ChatParrot(session=s, max_tokens=200).bind_tools([get_weather], tool_choice="any")
        reply = model.invoke([HumanMessage("What is the weather in Paris?")])
        assert reply.invalid_tool_calls == []  # type: ignore[attr-defined]
        (call,) = reply.tool_calls  # type: ignore[attr-defined]
        assert [call["name"], sorted(call["args"])] == ["get_weather", ["city"]]
        assert len(call["args"]["city"]) <= 16
