"""Prefix sharing in the manager against the in-memory FakeEngine: exact engine traffic.

A shared prefix is filled once per engine into a cached prefix context; calls fork from it and fill
only the rest. Switched off, every call fills its whole prompt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fake_engine import FakeEngine
from manager_harness import run_manager

from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import ManagerConfig, SchedulingConfig, SharingConfig
from parrot.serve.http.openai.call import OneCall
from parrot.serve.manager import Manager
from parrot.text import Tokenizer

SYSTEM = "SYSTEM: You are a careful assistant who answers briefly and checks every fact twice. " * 2


def run(
    folder: Path, body: Callable[[Manager, FakeEngine], Awaitable[None]], config: ManagerConfig, **kw: object
) -> FakeEngine:
    engine = FakeEngine(folder, **kw)  # type: ignore[arg-type]

    async def with_engine(manager: Manager) -> None:
        await body(manager, engine)

    run_manager([engine], with_engine, config)
    return engine


def fills(engine: FakeEngine) -> list[tuple[str, int]]:
    """(context kind, tokens) of every fill, a generating Extend's tokens included: "pfx" for cached
    prefix contexts, else the call id."""
    kinds = ("fill", "generate-fill")
    return [("pfx" if c.startswith("pfx-") else c.split(".", 1)[1], n) for _, op, c, n in engine.log if op in kinds]


async def ask(manager: Manager, template: str, **inputs: str) -> str:
    created = manager.create_session("key")
    session = manager.session(created.session_id, created.token)
    bindings = {k: Binding(value=v) for k, v in inputs.items()}
    manager.submit(session, SubmitRequest(calls=[CallSpec(template=template, bindings=bindings)]))
    value = (await manager.get_variable(session, "c0~a")).value
    assert value is not None
    return value


def test_two_sessions_with_one_long_system_prompt_fill_it_once(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    template = SYSTEM + "{{input:q}} Answer:{{output:a}}"
    prompts = [tok.encode(SYSTEM + q + " Answer:") for q in ("first question", "second one")]
    # The system prompt ends with a space, which merges into the question's first word: the shared
    # prefix is the system prompt's tokens without it (the token boundary before the variable).
    n_system = len(tok.encode(SYSTEM.rstrip()))
    assert n_system >= 32 and prompts[0][:n_system] == prompts[1][:n_system] == tok.encode(SYSTEM.rstrip())
    rest = [len(p) - n_system for p in prompts]

    async def body(manager: Manager, engine: FakeEngine) -> None:
        assert await ask(manager, template, q="first question") == " ANSWER:"
        assert await ask(manager, template, q="second one") == " ANSWER:"

    shared = run(default_model_folder, body, ManagerConfig())
    assert fills(shared) == [("pfx", n_system), ("c0", rest[0]), ("c0", rest[1])]
    plain = run(default_model_folder, body, ManagerConfig(sharing=SharingConfig(prefix_sharing=False)))
    assert fills(plain) == [("c0", n_system + rest[0]), ("c0", n_system + rest[1])]
    # Every fork's context holds the whole prompt: the generations see the same tokens either way.
    assert generated_from(shared) == generated_from(plain) == [n_system + rest[0], n_system + rest[1]]


def generated_from(engine: FakeEngine) -> list[int]:
    return [n for _, op, _, n in engine.log if op == "generate"]


def test_branches_of_a_generated_shared_prefix_fill_it_once(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    design = " ".join(f"component{i} talks to component{i + 1} over a queue;" for i in range(6))
    roles = ["tester", "architect", "operator"]

    def responder(prompt: str) -> str:
        return design if prompt.endswith("Design:") else " OK"

    async def body(manager: Manager, engine: FakeEngine) -> None:
        created = manager.create_session("key")
        session = manager.session(created.session_id, created.token)
        calls = [CallSpec(template="Design:{{output:design}}")]
        calls += [
            CallSpec(
                template="Notes: {{input:design}}\nAs the {{input:role}}, review it:{{output:review}}",
                bindings={"design": Binding(var_id="c0~design"), "role": Binding(value=role)},
            )
            for role in roles
        ]
        manager.submit(session, SubmitRequest(calls=calls))
        for i in (1, 2, 3):
            assert (await manager.get_variable(session, f"c{i}~review")).value == " OK"
        assert session.runs["c2"].num_cached_tokens >= 30

    engine = run(default_model_folder, body, ManagerConfig(), responder=responder)
    # The longest prefix the branches share runs up to their first difference, the role.
    # The space before the role merges into the role's first word, so the shared tokens end before it.
    n_shared = len(tok.encode("Notes: " + design + "\nAs the"))
    prompts = [tok.encode(f"Notes: {design}\nAs the {r}, review it:") for r in roles]
    assert all(p[:n_shared] == prompts[0][:n_shared] for p in prompts)
    tails = {f"c{i}": len(p) - n_shared for i, p in zip((1, 2, 3), prompts, strict=True)}
    got = fills(engine)
    # The producer's prompt, then the shared "Notes: <design>\nAs the" once, then each role's tail.
    assert got[0] == ("c0", len(tok.encode("Design:")))
    assert got[1] == ("pfx", n_shared)
    assert sorted(got[2:]) == sorted(tails.items())


def test_plain_requests_share_chat_prefixes_and_report_cached_tokens(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    system = {"role": "system", "content": "You are Parrot, a terse assistant. " * 6}

    async def body(manager: Manager, engine: FakeEngine) -> None:
        usages = []
        for question in ("What is a parrot?", "Why is the sky blue?"):
            messages = [system, {"role": "user", "content": question}]
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
            prefixes = tok.encode_batch(
                [tok.apply_chat_template(messages[:k], add_generation_prompt=False) for k in (1, 2)]
            )
            run_ = OneCall(manager, "key", "fake", prompt, [SamplingParams(max_tokens=4)], prefixes=prefixes)
            await run_.complete()
            usages.append(run_.usage())
        n_system = len(tok.encode(tok.apply_chat_template([system], add_generation_prompt=False)))
        assert usages[0].prompt_tokens_details is not None and usages[1].prompt_tokens_details is not None
        assert usages[0].prompt_tokens_details.cached_tokens == 0
        assert usages[1].prompt_tokens_details.cached_tokens == n_system - 1
        assert [u.prompt_tokens for u in usages] == [
            len(tok.encode(tok.apply_chat_template([system, {"role": "user", "content": q}])))
            for q in ("What is a parrot?", "Why is the sky blue?")
        ]

    run(default_model_folder, body, ManagerConfig())


def test_objectives_are_deduced_and_shown_in_session_status(default_model_folder: Path) -> None:
    async def body(manager: Manager, engine: FakeEngine) -> None:
        created = manager.create_session("key")
        session = manager.session(created.session_id, created.token)
        maps = [CallSpec(template=f"Part {i}: {{{{output:s}}}}") for i in range(3)]
        reduce_ = CallSpec(
            template="Join {{input:a}} {{input:b}} {{input:c}}:{{output:r}}",
            bindings={k: Binding(var_id=f"c{i}~s") for i, k in enumerate("abc")},
        )
        manager.submit(session, SubmitRequest(calls=[*maps, reduce_]))
        await manager.get_variable(session, "c3~r", Criteria.LATENCY)
        calls = {c.call_id: c for c in manager.status(session).calls}
        assert [(calls[f"c{i}"].objective, calls[f"c{i}"].task_group) for i in range(3)] == [
            (Criteria.THROUGHPUT, "c3")
        ] * 3
        assert [calls["c3"].objective, calls["c3"].urgency, calls["c3"].task_group] == [
            Criteria.LATENCY,
            Criteria.LATENCY,
            None,
        ]

    run(
        default_model_folder, body, ManagerConfig(scheduling=SchedulingConfig(policy="app_centric")), token_delay_s=0.01
    )
