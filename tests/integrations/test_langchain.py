"""LangChain on Parrot with the real `langchain-core` and the tiny engine: an LCEL map-reduce runs as
one DAG on the server (the consumer's call arrives before its producers finish), and the models'
invoke / batch / stream / async forms return what the engine generates for their prompts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnableSequence
from live_server import LiveServer

from examples.langchain_map_reduce import langchain_map_reduce
from parrot.frontend import SamplingParams, Session
from parrot.integrations.langchain import ChatParrot, ParrotLLM, resolver
from parrot.protocol.public_api import SubmitRequest
from parrot.text import Tokenizer

TINY = {"max_tokens": 4, "ignore_eos": True}


def map_reduce(llm: ChatParrot, session: Session) -> RunnableSequence[Any, Any]:
    summarize = ChatPromptTemplate.from_template("Summarize: {chunk}") | llm | StrOutputParser()
    combine = ChatPromptTemplate.from_template("Combine these summaries:\n{summaries}") | llm | StrOutputParser()
    fan_out = RunnableLambda(lambda chunks: [{"chunk": c} for c in chunks])
    join = RunnableLambda(lambda summaries: {"summaries": "\n".join(summaries)})
    return RunnableSequence(fan_out, summarize.map(), join, combine, resolver(session))


def chat_prompt(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def test_an_lcel_map_reduce_is_one_dag_on_the_server(server: LiveServer) -> None:
    topics = ["cats sleep a lot", "dogs bark at night", "birds sing at dawn"]
    with Session(server.url) as s:
        # Each step awaited by the client (LangChain's usual way): the reference result.
        awaited = map_reduce(ChatParrot(session=s, sampling=TINY), s).invoke([f"notes: {t}" for t in topics])
        num_calls_before = s.status().num_calls
        # Lazy: the whole chain is submitted while its input is not even set, so no call can have
        # run, let alone finished, before the consumer reached the server.
        doc = s.variable("doc")
        lazy = ChatParrot(session=s, lazy=True, sampling=TINY)
        pending = map_reduce(lazy, s).steps[:-1]  # all but the resolver: nothing waits
        deferred = RunnableSequence(*pending).invoke([f"{doc}: {t}" for t in topics])
        new = [c for c in s.status().calls if int(c.call_id[1:]) >= num_calls_before]
        assert [c.state for c in new] == ["waiting"] * 4
        ids = {c.call_id for c in new}
        outputs = [v for v in s.list_variables().variables if v.producer_call_id in ids]
        assert [v.num_consumers for v in outputs] == [1, 1, 1, 0]  # three summaries feed the combine
        doc.set("notes")
        assert lazy.resolve(deferred) == awaited
        assert [c.state for c in s.status().calls if c.call_id in ids] == ["done"] * 4
        # Run async, the chain's resolver awaits the variables together: the same text again.
        async_result = asyncio.run(map_reduce(lazy, s).ainvoke([f"notes: {t}" for t in topics]))
        assert async_result == awaited


def test_the_consumer_reaches_the_server_before_its_producers_finish(server: LiveServer) -> None:
    submits: list[tuple[float, list[str]]] = []
    submit_async = server.manager.submit_async

    async def recording_submit(session: Any, req: SubmitRequest, *args: Any) -> Any:
        submits.append((time.monotonic(), [c.template for c in req.calls]))
        return await submit_async(session, req, *args)

    server.manager.submit_async = recording_submit  # type: ignore[method-assign]
    with Session(server.url) as s:
        llm = ChatParrot(session=s, lazy=True, sampling={"max_tokens": 48, "ignore_eos": True})
        result = map_reduce(llm, s).invoke(["apples", "pears", "plums"])
        assert isinstance(result, str) and result
    combine_sent = next(t for t, templates in submits if any("Combine" in tpl for tpl in templates))
    generated = [t for t, op, ctx, _ in server.engine.log if op == "generated"]
    assert len(generated) == 4
    assert combine_sent < min(generated)  # queued on the server while every producer still ran
    assert server.engine.first("generate", ".c3") > max(generated[:3])  # and run after them


def test_invoke_batch_stream_and_async_forms(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    sampling = SamplingParams(max_tokens=4, ignore_eos=True)

    def expected(prompt: str) -> str:
        return server.direct_generate(tok.encode(prompt), sampling)

    with Session(server.url) as s:
        chat = ChatParrot(session=s, sampling=TINY)
        assert chat.invoke("Hello").content == expected(chat_prompt("Hello"))
        replies = chat.batch(["one", "two"])
        assert [m.content for m in replies] == [expected(chat_prompt("one")), expected(chat_prompt("two"))]
        assert "".join(str(c.content) for c in chat.stream("Hello")) == expected(chat_prompt("Hello"))
        llm = ParrotLLM(session=s, sampling=TINY)
        assert llm.invoke("Once upon a time") == expected("Once upon a time")
        assert llm.batch(["A", "B"]) == [expected("A"), expected("B")]
        assert "".join(llm.stream("Once upon a time")) == expected("Once upon a time")
        lazy = ParrotLLM(session=s, lazy=True, sampling=TINY)
        marker = lazy.invoke("Once upon a time")
        assert marker.startswith("\ue000parrot:") and lazy.resolve(marker) == expected("Once upon a time")

        async def main() -> list[Any]:
            reply = await chat.ainvoke("Hello")
            chunks = [str(c.content) async for c in chat.astream("Hello")]
            texts = await llm.abatch(["A", "B"])
            lazy_chat = ChatParrot(session=s, lazy=True, sampling=TINY)
            deferred = await lazy_chat.ainvoke("Hello")
            return [reply.content, "".join(chunks), texts, await lazy_chat.aresolve(deferred.content)]

        hello = expected(chat_prompt("Hello"))
        assert asyncio.run(main()) == [hello, hello, [expected("A"), expected("B")], hello]


def test_the_langchain_example_gives_one_result_both_ways(server: LiveServer) -> None:
    text = " ".join(f"word{i}" for i in range(40))
    awaited = langchain_map_reduce(text, server.url, chunk_len=10, lazy=False, max_tokens=4)
    lazy = langchain_map_reduce(text, server.url, chunk_len=10, lazy=True, max_tokens=4)
    assert lazy == awaited and lazy
    assert sum(op == "generated" for _, op, _, _ in server.engine.log) == 2 * (4 + 1)
