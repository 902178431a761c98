"""Declaring semantic and native functions: parameters against placeholders, sampling, refusals.
No server: calls are checked against the queue of a session core that never sends."""

from __future__ import annotations

import asyncio

import pytest

from parrot.frontend import Input, Output, ParrotError, SamplingParams, native_function, semantic_function
from parrot.frontend.core import SessionCore
from parrot.frontend.function import SemanticFunction
from parrot.frontend.transport import ApiTransport
from parrot.protocol.public_api import Binding, CallSpec, VariableSpec


class QueueOnlyCore(SessionCore):
    """A core whose operations stay in the queue (nothing is sent), so tests can read them."""

    def __init__(self) -> None:
        super().__init__(ApiTransport("http://unused"), asyncio.new_event_loop())

    def _push(self, op: VariableSpec | CallSpec, vars_: list) -> None:  # type: ignore[type-arg]
        self._queue.append((op, vars_))
        self._num_queued += 1


@semantic_function(sampling=SamplingParams(max_tokens=7))
def joke(topic: Input, joke: Output = Output(max_tokens=20, stop=["\n"]), explanation: Output = Output()):  # noqa: B008
    """Tell a joke about {{input:topic}}.
    Joke:{{output:joke}}
    Explanation:{{output:explanation}}"""


def test_docstring_template_params_and_sampling() -> None:
    assert isinstance(joke, SemanticFunction)
    assert (
        joke.template == "Tell a joke about {{input:topic}}.\nJoke:{{output:joke}}\nExplanation:{{output:explanation}}"
    )
    assert [joke.inputs, joke.outputs] == [["topic"], ["joke", "explanation"]]
    assert joke.sampling == {
        "joke": SamplingParams(max_tokens=20, stop=["\n"]),
        "explanation": SamplingParams(max_tokens=7),
    }
    assert joke.default_sampling == SamplingParams(max_tokens=7)


def test_call_queues_output_variables_then_the_call() -> None:
    core = QueueOnlyCore()
    topic = core.new_variable("topic")
    j, e = joke.invoke(core, topic)
    assert [j.var_id, j.name, e.var_id, e.name] == ["v1", "joke", "v2", "explanation"]
    ops = [op for op, _ in core._queue]
    assert ops[:3] == [
        VariableSpec(var_id="v0", name="topic"),
        VariableSpec(var_id="v1", name="joke"),
        VariableSpec(var_id="v2", name="explanation"),
    ]
    call = ops[3]
    assert isinstance(call, CallSpec)
    assert call.bindings == {
        "topic": Binding(var_id="v0"),
        "joke": Binding(var_id="v1"),
        "explanation": Binding(var_id="v2"),
    }
    assert call.sampling == joke.sampling
    assert call.name == "joke"
    # Plain values go inline; an output may be given a variable to write.
    target = core.new_variable("target")
    out = joke.invoke(core, topic=42, explanation=target)
    assert out[1] is target
    last = core._queue[-1][0]
    assert isinstance(last, CallSpec)
    assert last.bindings["topic"] == Binding(value="42")
    assert last.bindings["explanation"] == Binding(var_id=target.var_id)


def test_string_template_and_positional_default() -> None:
    translate = SemanticFunction("translate", "Translate {{text}} into French: {{french}}", ["text"], {"french": None})
    core = QueueOnlyCore()
    out = translate.invoke(core, "hello")
    assert out.name == "french"
    assert core._queue[-1][0].bindings == {"text": Binding(value="hello"), "french": Binding(var_id=out.var_id)}


def test_mismatched_declarations_are_refused() -> None:
    with pytest.raises(ParrotError, match="the template's inputs \\['x'\\] do not match the parameters \\['y'\\]"):

        @semantic_function
        def bad(y: Input, out: Output):
            """Use {{input:x}}: {{output:out}}"""

    with pytest.raises(ParrotError, match="outputs \\['out'\\] do not match the Output parameters \\['other'\\]"):

        @semantic_function
        def bad2(x: Input, other: Output):
            """Use {{input:x}}: {{output:out}}"""

    with pytest.raises(ParrotError, match="unknown placeholder kind 'inptu'"):

        @semantic_function
        def bad3(x: Input, out: Output):
            """Use {{inptu:x}}: {{output:out}}"""

    with pytest.raises(ParrotError, match="no template"):

        @semantic_function
        def bad4(x: Input, out: Output):
            pass


def test_bad_arguments_raise_type_errors() -> None:
    core = QueueOnlyCore()
    with pytest.raises(TypeError, match="missing inputs \\['topic'\\]"):
        joke.invoke(core)
    with pytest.raises(TypeError, match="has no parameter 'colour'"):
        joke.invoke(core, "x", colour="red")
    with pytest.raises(TypeError, match="takes a SemanticVariable, text or a list of them, not <class 'dict'>"):
        joke.invoke(core, {"a": "mapping"})
    with pytest.raises(TypeError, match=r"input 'topic'\[0\]: a list item takes a SemanticVariable or text"):
        joke.invoke(core, [["nested"]])
    other = QueueOnlyCore().new_variable("elsewhere")
    with pytest.raises(ParrotError, match="belongs to another session"):
        joke.invoke(core, other)
    with pytest.raises(RuntimeError, match="no Parrot session is active"):
        joke("x")


def test_native_function_declaration() -> None:
    @native_function
    def count(text: str, unit: str = "words") -> str:
        return f"{len(text.split())} {unit}"

    assert count.name == "count"
    with pytest.raises(TypeError, match="use named parameters"):

        @native_function
        def star(*parts: str) -> str:
            return "".join(parts)
