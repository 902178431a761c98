"""Prefix sharing on the real tiny engine: the engine's own count of computed prompt tokens
(EngineStats.num_prefill_tokens) shows a shared prefix computed once, and outputs stay exact.

Accounting: a fill computes all but its last token; a fork's fill computes its parent's last token
and all but its own last; a generate computes the prompt's last token (counted as prefill) in
the step that samples its first output token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from engine_farm import reference

from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import ManagerConfig, SharingConfig
from parrot.serve.manager import Manager, create_manager
from parrot.text import Tokenizer

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SYSTEM = "You are the release manager of a large open source project. Answer in one short line. " * 2


def prefill_tokens(engine: AsyncEngine, config: ManagerConfig, body: Callable[[Manager], Awaitable[None]]) -> int:
    async def main() -> int:
        manager = create_manager([engine], config=config)
        await manager.start()
        before = (await engine.stats()).num_prefill_tokens
        try:
            await body(manager)
            return (await engine.stats()).num_prefill_tokens - before
        finally:
            await manager.stop()

    return asyncio.run(main())


def test_two_sessions_with_one_system_prompt_compute_it_once(tiny_engine: AsyncEngine) -> None:
    tok = Tokenizer(tiny_engine.model_folder)
    questions = ["When is the next release?", "Who reviews the changelog?"]
    prompts = [tok.encode(SYSTEM + q + "\nAnswer:") for q in questions]
    n_system = len(tok.encode(SYSTEM.rstrip()))  # its last space merges into the question's first word
    tails = [len(p) - n_system for p in prompts]
    answers: dict[bool, list[str]] = {}

    def body(sharing: bool) -> Callable[[Manager], Awaitable[None]]:
        async def go(manager: Manager) -> None:
            answers[sharing] = []
            for q in questions:  # one after the other: the second finds the first's prefix
                created = manager.create_session("key")
                session = manager.session(created.session_id, created.token)
                spec = CallSpec(
                    template=SYSTEM + "{{input:q}}\nAnswer:{{output:a}}",
                    bindings={"q": Binding(value=q)},
                    default_sampling=GREEDY,
                )
                manager.submit(session, SubmitRequest(calls=[spec]))
                value = (await manager.get_variable(session, "c0~a")).value
                assert value is not None
                answers[sharing].append(value)
                second = len(answers[sharing]) == 2
                assert session.runs["c0"].num_cached_tokens == (n_system - 1 if sharing and second else 0)

        return go

    shared = prefill_tokens(tiny_engine, ManagerConfig(), body(True))
    plain = prefill_tokens(tiny_engine, ManagerConfig(sharing=SharingConfig(prefix_sharing=False)), body(False))
    # Every prompt token is computed once, except the system prompt's reused ones (all but its last,
    # which the second call computes: a fill leaves its last token to the next request).
    assert shared == n_system + tails[0] + 1 + tails[1]
    assert plain == (n_system + tails[0]) + (n_system + tails[1])
    expected = [asyncio.run(reference(tiny_engine, p, GREEDY)) for p in prompts]
    assert answers[True] == answers[False] == expected


def test_branches_of_a_generated_prefix_compute_it_once(tiny_engine: AsyncEngine) -> None:
    tok = Tokenizer(tiny_engine.model_folder)
    roles = ["tester", "architect", "operator"]
    design_sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    reviews: dict[bool, tuple[str, list[str]]] = {}

    def body(sharing: bool) -> Callable[[Manager], Awaitable[None]]:
        async def go(manager: Manager) -> None:
            created = manager.create_session("key")
            session = manager.session(created.session_id, created.token)
            calls = [CallSpec(template="Design a queue service:{{output:design}}", default_sampling=design_sampling)]
            calls += [
                CallSpec(
                    template="Notes: {{input:design}}\nAs the {{input:role}}, review it:{{output:review}}",
                    bindings={"design": Binding(var_id="c0~design"), "role": Binding(value=role)},
                    default_sampling=GREEDY,
                )
                for role in roles
            ]
            manager.submit(session, SubmitRequest(calls=calls))
            got = [(await manager.get_variable(session, f"c{i}~review")).value or "" for i in (1, 2, 3)]
            reviews[sharing] = (session.graph.variables["c0~design"].value or "", got)

        return go

    shared = prefill_tokens(tiny_engine, ManagerConfig(), body(True))
    plain = prefill_tokens(tiny_engine, ManagerConfig(sharing=SharingConfig(prefix_sharing=False)), body(False))
    design, got = reviews[True]
    assert reviews[False] == reviews[True]
    n_producer = len(tok.encode("Design a queue service:"))
    # Shared by the branches: everything up to the role.
    prompts = [tok.encode(f"Notes: {design}\nAs the {r}, review it:") for r in roles]
    n_shared = len(tok.encode(f"Notes: {design}\nAs the"))  # the space merges into the role
    tails = [len(p) - n_shared for p in prompts]
    assert n_shared > 40
    # The shared prefix is computed once (all but its last token, which each branch computes).
    assert shared == n_producer + (n_shared - 1) + sum(1 + t for t in tails)
    assert plain == n_producer + sum(n_shared + t for t in tails)
    expected = [asyncio.run(reference(tiny_engine, p, GREEDY)) for p in prompts]
    assert got == expected
