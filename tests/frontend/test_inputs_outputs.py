"""Inputs and outputs as the SDK sends them, no server: lists and text holding variables expand into
placeholders, constrained and typed outputs travel as sampling settings, `samples` queues n calls
in one batch. The calls are read from the queue of a session core that never sends."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from parrot.frontend import Input, Output, ParrotError, SamplingParams, select, semantic_function
from parrot.frontend.core import SessionCore, current_core
from parrot.frontend.markers import VarRef, marker, split_markers
from parrot.frontend.transport import ApiTransport
from parrot.protocol.public_api import Binding, CallSpec, VariableSpec
from parrot.protocol.template import parse_template


class QueueOnlyCore(SessionCore):
    def __init__(self, key: str = "s1") -> None:
        super().__init__(ApiTransport("http://unused"), asyncio.new_event_loop())
        self.key = key

    def _push(self, op: VariableSpec | CallSpec, vars_: list) -> None:  # type: ignore[type-arg]
        self._queue.append((op, vars_))
        self._num_queued += 1

    def calls(self) -> list[CallSpec]:
        return [op for op, _ in self._queue if isinstance(op, CallSpec)]


@semantic_function
def combine(items: Input, summary: Output):
    """Combine these:
    {{input:items}}
    Summary:{{output:summary}}"""


@semantic_function
def listing(items: Input = Input(numbered=False, sep=", "), answer: Output = Output()):  # noqa: B008
    """Items: {{input:items}}. Answer:{{output:answer}}"""


class Person(BaseModel):
    name: str
    age: int


@semantic_function
def extract(text: Input, person: Output = Output(schema=Person), verdict: Output = select(["yes", "no"])):  # noqa: B008
    """Text: {{input:text}}
    Person:{{output:person}}
    Adult?{{output:verdict}}"""


def test_plain_lists_are_one_inline_value() -> None:
    core = QueueOnlyCore()
    combine.invoke(core, ["alpha", "beta", 3])
    listing.invoke(core, ("x", "y"))
    first, second = core.calls()
    assert first.template == combine.template
    assert first.bindings["items"] == Binding(value="1. alpha\n2. beta\n3. 3")
    assert second.bindings["items"] == Binding(value="x, y")


def test_lists_and_text_with_variables_expand_into_placeholders() -> None:
    core = QueueOnlyCore()
    a, b = core.new_variable("a"), core.new_variable("b")
    combine.invoke(core, [a, "plain {{ braces", b])
    combine.invoke(core, f"first {a} then {b}!")
    combine.invoke(core, [a])  # one item: still numbered, so expanded
    combine.invoke(core, f"{a}")  # just the marker: bound to the variable itself
    lists, text, single, alone = core.calls()
    assert lists.template == (
        "Combine these:\n1. {{input:items__1}}\n2. plain \\{{ braces\n3. {{input:items__3}}\nSummary:{{output:summary}}"
    )
    assert [lists.bindings["items__1"], lists.bindings["items__3"]] == [Binding(var_id="v0"), Binding(var_id="v1")]
    assert "items" not in lists.bindings
    assert parse_template(lists.template).input_names == ("items__1", "items__3")
    expected = "Combine these:\nfirst {{input:items__1}} then {{input:items__3}}!\nSummary:{{output:summary}}"
    assert text.template == expected
    assert single.template == "Combine these:\n1. {{input:items__1}}\nSummary:{{output:summary}}"
    assert [alone.template, alone.bindings["items"]] == [combine.template, Binding(var_id="v0")]


def test_a_backslash_before_a_variable_becomes_a_value_of_its_own() -> None:
    core = QueueOnlyCore()
    path = core.new_variable("path")
    combine.invoke(core, f"C:\\dir\\{path}")
    (call,) = core.calls()
    assert call.template == "Combine these:\nC:\\dir{{input:text__1}}{{input:items__1}}\nSummary:{{output:summary}}"
    assert [call.bindings["text__1"], call.bindings["items__1"]] == [Binding(value="\\"), Binding(var_id="v0")]


def test_markers_name_their_session_and_a_foreign_one_is_refused() -> None:
    core, other = QueueOnlyCore("s1"), QueueOnlyCore("s2")
    var = other.new_variable("x")
    assert str(var) == marker("s2", "v0") == "\ue000parrot:s2/v0\ue001"
    assert split_markers(f"a{var}b") == ["a", VarRef("s2", "v0"), "b"]
    with pytest.raises(ParrotError, match="'v0' belongs to another session") as info:
        combine.invoke(core, f"see {var}")
    assert info.value.field == "items"


def test_too_many_variables_in_one_input_name_the_template() -> None:
    core = QueueOnlyCore()
    many = [core.new_variable() for _ in range(300)]
    with pytest.raises(ParrotError, match="placeholders; the limit is 256") as info:
        combine.invoke(core, many)
    assert info.value.field == "combine.template"


def test_constrained_and_typed_outputs_travel_as_sampling() -> None:
    core = QueueOnlyCore()
    person, verdict = extract.invoke(core, "Ada, 36")
    (call,) = core.calls()
    assert call.sampling["person"].json_schema == Person.model_json_schema()
    assert call.sampling["verdict"].choices == ["yes", "no"]
    assert [call.sampling["person"].choices, call.sampling["verdict"].json_schema] == [None, None]
    assert person.parsed('{"name": "Ada", "age": 36}') == Person(name="Ada", age=36)
    assert verdict.parsed("yes") == "yes"
    with pytest.raises(ParrotError, match="output 'person': the output is not a valid Person") as info:
        person.parsed('{"name": "Ada"}')
    assert [info.value.status, info.value.field] == [502, "person"]
    raw = Output(schema={"type": "array", "items": {"type": "integer"}})
    assert raw.parse is not None and raw.parse("[1, 2]") == [1, 2]
    assert Output(regex=r"\d+").settings == {"regex": r"\d+"}


def test_two_constraints_on_one_output_are_refused() -> None:
    with pytest.raises(ParrotError, match="at most one of regex, json_schema, choices") as info:
        Output(regex="a+", choices=["a"])
    assert info.value.field == "Output.choices"
    with pytest.raises(ParrotError) as info:
        extract.with_sampling(outputs={"verdict": {"regex": "y|n"}}).sampling  # noqa: B018
    assert info.value.field == "extract.verdict.choices"
    with pytest.raises(ParrotError, match="select takes a list of non-empty strings"):
        select("yes")
    with pytest.raises(ParrotError, match="sampling setting 'regex'") as info:
        Output(regex="")
    assert info.value.field == "Output.regex"


def test_samples_queue_n_calls_in_one_batch_with_distinct_seeds() -> None:
    core = QueueOnlyCore()
    token = current_core.set(core)
    try:
        outs = combine.with_sampling(seed=7, temperature=0.8).samples(3, ["a", "b"])
        plain = combine.samples(2, "x")
        with pytest.raises(ParrotError, match=r"n must be 1\.\.4096") as info:
            combine.samples(0, "x")
        assert info.value.field == "n"
    finally:
        current_core.reset(token)
    assert [v.var_id for v in outs] == ["v0", "v1", "v2"]
    calls = core.calls()
    assert [c.sampling["summary"].seed for c in calls] == [7, 8, 9, None, None]
    assert calls[0].bindings == {"items": Binding(value="1. a\n2. b"), "summary": Binding(var_id="v0")}
    assert calls[1].model_copy(update={"bindings": {}, "sampling": {}}) == calls[0].model_copy(
        update={"bindings": {}, "sampling": {}}
    )
    assert [v._seq for v in [*outs, *plain]] == [4, 5, 6, 9, 10]
    assert calls[0].sampling["summary"] == SamplingParams(seed=7, temperature=0.8)
