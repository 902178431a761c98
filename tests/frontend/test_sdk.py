"""The SDK against a real server and the tiny engine: sync and asyncio sessions, multi-output
templates, shared variables, inline values, native functions, streaming, 1,000-call sessions."""

from __future__ import annotations

import asyncio
import threading

import pytest
from live_server import LiveServer

from parrot.frontend import (
    AsyncSession,
    Input,
    Output,
    ParrotError,
    SamplingParams,
    SemanticFunction,
    Session,
    native_function,
    semantic_function,
)
from parrot.text import Tokenizer

TINY = SamplingParams(max_tokens=3, ignore_eos=True)


@semantic_function(sampling=TINY)
def joke_and_explanation(topic: Input, joke: Output, explanation: Output = Output(max_tokens=5, ignore_eos=True)):  # noqa: B008
    """Tell a joke about {{input:topic}}.
    Joke:{{output:joke}}
    Explanation:{{output:explanation}}"""


@semantic_function(sampling=TINY)
def react(text: Input, reaction: Output):
    """React to {{input:text}}:{{output:reaction}}"""


@native_function
def shout(text: str, marks: int = 2) -> str:
    return text.upper() + "!" * marks


@native_function
def explode(text: str) -> str:
    raise ValueError(f"cannot handle {len(text)} chars")


def test_multi_output_shared_variables_inline_values_and_natives(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    with Session(server.url, api_key="k") as s:
        topic = s.variable("topic")
        joke, explanation = joke_and_explanation(topic)
        first, second = react(joke), react(joke)  # one variable, two consumers
        loud = shout(explanation, marks=3)  # native, in the client
        after_native = react(loud)  # a semantic call consuming the native result
        inline = react("an inline value")
        topic.set("cats")

        joke_text, explanation_text = joke.get(), explanation.get()
        # Both outputs were generated in one context: the explanation continues after the joke.
        prefix = tok.encode("Tell a joke about cats.\nJoke:")
        assert joke_text == server.direct_generate(prefix, TINY)
        assert len(tok.encode(explanation_text)) <= 5 and explanation_text
        assert first.get() == second.get() == server.direct_generate(tok.encode(f"React to {joke_text}:"), TINY)
        assert loud.get() == explanation_text.upper() + "!!!"
        assert after_native.get() == server.direct_generate(tok.encode(f"React to {loud.get()}:"), TINY)
        assert inline.get() == server.direct_generate(tok.encode("React to an inline value:"), TINY)
        status = s.status()
        assert [status.num_calls, status.num_calls_done, status.num_calls_failed] == [5, 5, 0]
        names = {v.var_id: v.name for v in s.list_variables().variables}
        assert names[joke.var_id] == "joke" and names[loud.var_id] == "shout"


def test_streaming_get_in_sync_and_async_code(server: LiveServer) -> None:
    long = SamplingParams(max_tokens=12, ignore_eos=True)
    with Session(server.url) as s:
        story = react.invoke(s.core, "a dragon")  # explicit session form
        chunks = list(story.stream())
        assert len(chunks) >= 2
        assert "".join(chunks) == story.get()
        # A set input streams as one chunk.
        given = s.variable("given", "already here")
        assert list(given.stream()) == ["already here"]

    async def main() -> None:
        async with AsyncSession(server.url) as s:
            tell = SemanticFunction("tell", "Tell me about {{input:x}}:{{output:y}}", ["x"], {"y": long})
            out = tell("the sea")  # finds the active session
            assert out._core is s.core
            chunks = [c async for c in out.astream()]
            assert len(chunks) >= 2 and "".join(chunks) == await out.aget()

    asyncio.run(main())


def test_errors_reach_dependents_through_native_functions(server: LiveServer) -> None:
    with Session(server.url) as s:
        broken = explode(react("something"))
        downstream = react(broken)
        with pytest.raises(ParrotError) as info:
            downstream.get()
        assert info.value.status == 424
        assert "native" in info.value.message and "ValueError: cannot handle" in info.value.message
        with pytest.raises(ParrotError) as info:
            broken.get()
        assert info.value.status == 424
        # A refused batch fails its own variables, locally and at once.
        with pytest.raises(ParrotError) as info:
            react("word " * 5000).get()
        assert info.value.status == 400
        assert "exceed the model's context" in info.value.message
        with pytest.raises(ParrotError) as info:
            s.variable("x").get(timeout=0.05)
        assert info.value.status == 408


def test_a_thousand_tiny_calls_in_one_session(server: LiveServer) -> None:
    blocks_free = server.stats().num_blocks_free
    with Session(server.url) as s:
        outs = [react(f"item {i}") for i in range(1000)]
        consumers = [react(o) for o in outs[:10]]  # consumers of the first few
        values = [o.get() for o in outs]
        assert len(values) == 1000
        consumed = [c.get() for c in consumers]
        status = s.status()
        assert [status.num_calls, status.num_calls_done] == [1010, 1010]
        # Three tokens each (a value may still be empty: the random model can sample special tokens).
        assert [c.num_generated_tokens for c in status.calls] == [3] * 1010
        assert sum(map(bool, values + consumed)) > 900
        # Batched: 2,020 variables and 1,010 calls took a handful of submits.
        assert 1 <= s.core.transport.num_submits <= 20
    assert server.wait_blocks_free(blocks_free).num_blocks_free == blocks_free


def test_variables_of_another_session_and_deleted_sessions(server: LiveServer) -> None:
    with Session(server.url) as a, Session(server.url) as b:
        mine = a.variable("mine", "text")
        with pytest.raises(ParrotError, match="belongs to another session"):
            react.invoke(b.core, mine)
    with pytest.raises(ParrotError, match="its session is closed"):
        mine.get()


def test_sync_session_is_usable_from_threads(server: LiveServer) -> None:
    with Session(server.url) as s:
        results: dict[int, str] = {}

        def worker(i: int) -> None:
            results[i] = react.invoke(s.core, f"thread {i}").get()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 1, 2, 3] and all(results.values())
