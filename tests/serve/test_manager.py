"""The manager and its graph executor against the in-memory FakeEngine: exact engine traffic."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from manager_harness import new_session, run_manager

from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import LifecycleConfig, LimitsConfig, ManagerConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.serve.runtime.session import Session


def run(
    folder: Path,
    body: Callable[[Manager, Session, FakeEngine], Awaitable[None]],
    config: ManagerConfig | None = None,
    virtual: bool = False,
    **engine_kw: object,
) -> FakeEngine:
    engine = FakeEngine(folder, **engine_kw)  # type: ignore[arg-type]

    async def with_session(manager: Manager) -> None:
        await body(manager, new_session(manager), engine)

    run_manager([engine], with_session, config, virtual=virtual)
    return engine


def spec(template: str, sampling: SamplingParams | None = None, **bindings: Binding) -> CallSpec:
    return CallSpec(template=template, bindings=bindings, default_sampling=sampling or SamplingParams())


def ops(engine: FakeEngine) -> list[tuple[str, str, int]]:
    return [(op, ctx.split(".", 1)[1], n) for _, op, ctx, n in engine.log]


def test_consumer_prefix_is_filled_before_its_producer_finishes(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        tok = manager.pool.for_model("fake").tokenizer
        manager.submit(
            session,
            SubmitRequest(
                variables=[VariableSpec(var_id="doc", value="alpha beta"), VariableSpec(var_id="ready", value="gamma")],
                calls=[
                    spec("Summarize {{input:d}} now:{{output:s}}", d=Binding(var_id="doc")),
                    spec(
                        "Rewrite {{input:r}} then {{input:s}} done:{{output:t}}",
                        r=Binding(var_id="ready"),
                        s=Binding(var_id="c0~s"),
                    ),
                ],
            ),
        )
        got = await manager.get_variable(session, "c1~t")
        assert got.value == " DONE:"
        # The ready prefix "Rewrite gamma then " is filled up to its stable end (the trailing
        # space belongs to the next word); the run fills the rest of the rendered prompt.
        early = tok.encode("Rewrite gamma then")
        full = tok.encode("Rewrite gamma then  NOW: done:")
        assert full[: len(early)] == early
        prefix, rest = len(early), len(full) - len(early)
        producer_prompt = len(tok.encode("Summarize alpha beta now:"))
        assert ops(engine)[:6] == [
            ("fill", "c1", prefix),  # the consumer's ready prefix, before the producer even starts
            ("generate-fill", "c0", producer_prompt),  # a ready call's fill travels in its generating Extend
            ("generate", "c0", producer_prompt),
            ("free", "c0", 0),
            ("generate-fill", "c1", rest),
            ("generate", "c1", prefix + rest),
        ]
        assert manager.status(session).num_calls_done == 2

    run(default_model_folder, body, token_delay_s=0.005)


def test_multi_output_per_output_sampling_and_shared_variable(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        resp = manager.submit(
            session,
            SubmitRequest(
                calls=[
                    CallSpec(
                        template="Tell {{input:topic}} joke:{{output:joke}} why: because{{output:why}}",
                        bindings={"topic": Binding(value="cats")},
                        sampling={"joke": SamplingParams(max_tokens=1)},
                    ),
                    spec("A {{input:j}} one:{{output:a}}", j=Binding(var_id="c0~joke")),
                    spec("B {{input:j}} two:{{output:b}}", j=Binding(var_id="c0~joke")),
                ]
            ),
        )
        assert resp.calls[0].outputs == {"joke": "c0~joke", "why": "c0~why"}
        # " JOKE:" is several tokens; max_tokens=1 keeps the first. `why` continues after it.
        assert (await manager.get_variable(session, "c0~joke")).value == " JO"
        assert (await manager.get_variable(session, "c0~why")).value == " BECAUSE"
        assert (await manager.get_variable(session, "c1~a")).value == " ONE:"
        assert (await manager.get_variable(session, "c2~b")).value == " TWO:"
        assert session.runs["c0"].finish_reasons == {"joke": "length", "why": "eos"}
        assert session.graph.variables["c0~joke"].consumer_call_ids == ["c1", "c2"]

    run(default_model_folder, body)


def test_errors_propagate_to_every_dependent_variable(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        engine.fail_generate_when = lambda prompt: "BOOM" in prompt
        manager.submit(
            session,
            SubmitRequest(
                calls=[
                    spec("x BOOM {{output:a}}"),
                    spec("y {{input:a}} {{output:b}}", a=Binding(var_id="c0~a")),
                    spec("z {{input:b}} {{output:c}}", b=Binding(var_id="c1~b")),
                    spec("fine {{output:d}}"),
                ]
            ),
        )
        with pytest.raises(ParrotError) as first:
            await manager.get_variable(session, "c0~a")
        assert first.value.status == 500
        assert first.value.message == "call c0 failed: engine error while generating 'a': injected failure"
        with pytest.raises(ParrotError) as last:
            await manager.get_variable(session, "c2~c")
        assert last.value.status == 424
        assert last.value.message == (
            "input 'b' of call c2 failed: input 'a' of call c1 failed: "
            "call c0 failed: engine error while generating 'a': injected failure"
        )
        assert (await manager.get_variable(session, "c3~d")).value == " FINE"
        status = manager.status(session)
        assert [status.num_calls_done, status.num_calls_failed] == [1, 3]
        await manager.drain()
        assert engine.contexts == {}

    run(default_model_folder, body)


def test_set_get_errors_and_timeouts(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        manager.submit(
            session,
            SubmitRequest(
                variables=[VariableSpec(var_id="in")],
                calls=[spec("q {{input:x}} {{output:o}}", x=Binding(var_id="in"))],
            ),
        )
        with pytest.raises(ParrotError) as info:
            await manager.get_variable(session, "c0~o", timeout_s=0.05)
        assert [info.value.status, info.value.field] == [408, "timeout_s"]
        with pytest.raises(ParrotError) as info:
            manager.set_variable(session, "c0~o", "mine")
        assert info.value.status == 409
        with pytest.raises(ParrotError) as info:
            manager.set_variable(session, "nope", "v")
        assert [info.value.status, info.value.field] == [404, "var_id"]
        manager.set_variable(session, "in", "word")
        with pytest.raises(ParrotError) as info:
            manager.set_variable(session, "in", "again")
        assert info.value.status == 409
        got = await manager.get_variable(session, "c0~o", criteria=Criteria.THROUGHPUT)
        assert got.value == " WORD"
        # The first (timed-out) get asked for latency, and latency wins over throughput.
        assert session.graph.variables["c0~o"].criteria is Criteria.LATENCY
        assert session.graph.variables["in"].criteria is None
        # A client-side failure (a native function) reaches the consumers.
        manager.submit(
            session,
            SubmitRequest(
                variables=[VariableSpec(var_id="nat")],
                calls=[spec("n {{input:x}} {{output:o}}", x=Binding(var_id="nat"))],
            ),
        )
        manager.set_variable(session, "nat", None, error="ValueError: bad")
        with pytest.raises(ParrotError) as info:
            await manager.get_variable(session, "c1~o")
        assert info.value.status == 424
        assert "set to an error by the client: ValueError: bad" in info.value.message

    run(default_model_folder, body)


def test_prompts_past_the_context_are_refused(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        long_text = "word " * 300
        with pytest.raises(ParrotError) as info:
            manager.submit(session, SubmitRequest(calls=[spec("{{input:x}} {{output:o}}", x=Binding(value=long_text))]))
        assert [info.value.status, info.value.field] == [400, "calls[0].template"]
        assert "exceed the model's context of 256 tokens" in info.value.message
        assert manager.status(session).num_calls == 0 and session.graph.variables == {}
        # Known only at run time: the call fails and its get says why.
        manager.submit(
            session,
            SubmitRequest(
                variables=[VariableSpec(var_id="late")],
                calls=[spec("{{input:x}} {{output:o}}", x=Binding(var_id="late"))],
            ),
        )
        manager.set_variable(session, "late", long_text)
        with pytest.raises(ParrotError) as info:
            await manager.get_variable(session, "c0~o")
        assert [info.value.status, info.value.field] == [400, "prompt"]

    run(default_model_folder, body, max_model_len=256)


def test_awaited_names_a_variable_of_the_session_or_the_batch(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        call, out = spec("Say {{output:o}}", o=Binding(var_id="out")), [VariableSpec(var_id="out")]
        with pytest.raises(ParrotError) as info:
            manager.submit(session, SubmitRequest(variables=out, calls=[call], awaited={"nope": Criteria.LATENCY}))
        assert [info.value.status, info.value.field, session.graph.variables] == [400, "awaited", {}]
        # Named by the batch: its get's criteria are noted with it, before anything is dispatched.
        manager.submit(session, SubmitRequest(variables=out, calls=[call], awaited={"out": Criteria.THROUGHPUT}))
        assert session.graph.variables["out"].criteria is Criteria.THROUGHPUT
        assert (await manager.get_variable(session, "out")).value

    run(default_model_folder, body)


def test_delete_wakes_waiting_gets_and_frees_every_context(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        manager.submit(
            session,
            SubmitRequest(
                variables=[VariableSpec(var_id="never")],
                calls=[
                    spec("slow {{output:a}}", SamplingParams(max_tokens=50)),
                    spec("waits for {{input:n}} {{output:b}}", n=Binding(var_id="never")),
                ],
            ),
        )
        engine.responder = lambda prompt: " tok" * 50
        waiting = asyncio.create_task(manager.get_variable(session, "c1~b"))
        streaming = asyncio.create_task(_collect(await manager.stream_variable(session, "c0~a")))
        while len(engine.contexts) < 2 or not session.graph.variables["c0~a"].chunks:
            await asyncio.sleep(0.005)  # c0 generating, c1's prefix filled early
        await manager.delete_session(session)
        for task in (waiting, streaming):
            with pytest.raises(ParrotError) as info:
                await task
            assert info.value.status == 410
            assert info.value.message == f"session {session.session_id!r} was deleted"
        await manager.drain()
        assert engine.contexts == {}
        assert (await engine.stats()).num_blocks_free == engine.num_blocks
        with pytest.raises(ParrotError) as info:
            manager.session(session.session_id, "pst-whatever")
        assert info.value.status == 401

    run(default_model_folder, body, token_delay_s=0.01)


async def _collect(chunks) -> list[str]:  # type: ignore[no-untyped-def]
    return [c async for c in chunks]


def test_idle_sessions_expire(default_model_folder: Path) -> None:
    config = ManagerConfig(
        limits=LimitsConfig(session_idle_timeout_s=0.1), lifecycle=LifecycleConfig(expiry_interval_s=0.02)
    )

    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        created = manager.create_session("key")
        other = manager.session(created.session_id, created.token)
        manager.submit(
            other,
            SubmitRequest(
                variables=[VariableSpec(var_id="x")], calls=[spec("a {{input:x}} {{output:o}}", x=Binding(var_id="x"))]
            ),
        )
        # Virtual clock: idle from t=0; the expiry pass every 0.02 s removes it once idle for more
        # than 0.1 s: not at the 5th pass (0.1 s idle), at the 6th, 0.12 s.
        await asyncio.sleep(0.1199)
        assert created.session_id in manager.sessions.sessions
        await asyncio.sleep(0.0002)
        assert created.session_id not in manager.sessions.sessions
        with pytest.raises(ParrotError) as info:
            manager.session(created.session_id, created.token)
        assert info.value.status == 410
        assert info.value.message == f"session {created.session_id!r} was expired after 0.1 s idle"
        await manager.drain()
        assert engine.contexts == {}

    run(default_model_folder, body, config=config, virtual=True)


def test_session_tokens_are_checked(default_model_folder: Path) -> None:
    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        other = manager.create_session("key")
        for token, session_id, status in [
            (None, session.session_id, 401),
            ("pst-forged", session.session_id, 401),
            (other.token, session.session_id, 403),
            (other.token, "s-unknown", 404),
        ]:
            with pytest.raises(ParrotError) as info:
                manager.session(session_id, token)
            assert info.value.status == status

    run(default_model_folder, body)


def test_the_text_between_two_outputs_is_exactly_the_templates(default_model_folder: Path) -> None:
    """The first output ends on a stop string that begins inside the token " France": the context
    keeps " Paris, Fr" (the cut token's " Fr" re-tokenized) and the fill of "\\nB:" follows it; the
    run record's output tokens are the context's."""
    contexts: list[list[int]] = []  # what the context held at each generate

    def responder(prompt: str) -> str:
        contexts.append(list(engine.contexts[context_id]))
        return " Paris, France. More" if prompt.endswith("A:") else " DONE"

    engine = FakeEngine(default_model_folder, responder=responder)
    tok = engine.tokenizer
    stop = SamplingParams(stop=["ance"])

    async def body(manager: Manager) -> None:
        nonlocal context_id
        session = new_session(manager)
        context_id = f"{session.session_id}.c0"
        call = CallSpec(template="Q: {{input:q}}?\nA:{{output:a}}\nB:{{output:b}}", default_sampling=stop)
        manager.submit(session, SubmitRequest(calls=[call.model_copy(update={"bindings": {"q": Binding(value="x")}})]))
        assert (await manager.get_variable(session, "c0~a")).value == " Paris, Fr"
        assert (await manager.get_variable(session, "c0~b")).value == " DONE"
        first, second = contexts
        kept = tok.encode(" Paris,") + tok.encode(" Fr")  # " France" sampled, cut, " Fr" re-tokenized
        assert tok.encode(" Paris, France") == tok.encode(" Paris,") + tok.encode(" France")
        assert second[: len(first)] == first
        assert second[len(first) : len(first) + len(kept)] == kept
        assert tok.decode(second) == "Q: x?\nA: Paris, Fr\nB:"
        assert session.runs["c0"].output_token_ids == {"a": kept, "b": tok.encode(" DONE")}
        assert session.runs["c0"].finish_reasons == {"a": "stop", "b": "eos"}

    context_id = ""
    run_manager([engine], body)


@pytest.mark.parametrize("sharing", [False, True])
def test_a_ready_call_sends_each_outputs_fill_in_its_generating_extend(
    default_model_folder: Path, sharing: bool
) -> None:
    """No fill of its own before a generation: the prompt (forked from a cached prefix with
    sharing) and the text between outputs are the tokens of the generating Extend; outputs and
    usage exact."""
    system = "You are a careful assistant who answers in one short word. " * 3

    async def body(manager: Manager, session: Session, engine: FakeEngine) -> None:
        tok = manager.pool.for_model("fake").tokenizer
        template = system + "Question: {{input:q}} first:{{output:a}} and second:{{output:b}}"
        manager.submit(session, SubmitRequest(calls=[spec(template, q=Binding(value="why"))]))
        assert [(await manager.get_variable(session, v)).value for v in ("c0~a", "c0~b")] == [" FIRST:", " SECOND:"]
        first = tok.encode(system + "Question: why first:")
        second = tok.encode(" and second:")
        n_first_out = len(tok.encode(" FIRST:"))
        kinds = ("fill", "generate-fill", "generate")
        call_ops = [(op, n) for _, op, c, n in engine.log if c.endswith(".c0") and op in kinds]
        if sharing:  # the cached prefix is filled on its own (its context is not the call's)
            [n_pfx] = [n for _, op, c, n in engine.log if op == "fill" and c.startswith("pfx-")]
            assert first[:n_pfx] == tok.encode(system + "Question:")  # the constant text
            head = [("generate-fill", len(first) - n_pfx)]
        else:
            assert [op for _, op, _, _ in engine.log].count("fill") == 0
            head = [("generate-fill", len(first))]
        assert call_ops == [
            *head,
            ("generate", len(first)),
            ("generate-fill", len(second)),
            ("generate", len(first) + n_first_out + len(second)),
        ]
        run = session.runs["c0"]
        assert run.num_prompt_tokens == len(first) + len(second)
        assert run.num_cached_tokens == 0  # with sharing the prefix is its own, computed for it
        assert run.num_early_filled_tokens == 0

    run(default_model_folder, body, ManagerConfig(sharing=SharingConfig(prefix_sharing=sharing)))
