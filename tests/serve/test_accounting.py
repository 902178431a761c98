"""Truthful accounting on the real tiny engine: each call's prompt tokens split into reused from
other calls' prefixes, and computed for it (early or not); the session's per-engine totals and the
engine's own counters agree exactly."""

from __future__ import annotations

import asyncio

from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import ManagerConfig, SharingConfig
from parrot.serve.manager import create_manager

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
DOCS = "Document: the release train leaves every second Tuesday; hotfixes ride along when reviewed. " * 3


def test_call_usage_splits_reused_early_and_computed_and_agrees_with_the_engine(tiny_engine: AsyncEngine) -> None:
    async def main() -> None:
        manager = create_manager([tiny_engine], config=ManagerConfig(sharing=SharingConfig(min_prefix_tokens=16)))
        await manager.start()
        try:
            before = await tiny_engine.stats()
            created = manager.create_session("key")
            session = manager.session(created.session_id, created.token)
            # A RAG-like app: a query rewritten first, then the answer over long documents; the
            # answer's document prefix is filled early while the rewrite runs.
            calls = [
                CallSpec(
                    template="Rewrite the question: {{input:q}}\nRewritten:{{output:rq}}",
                    default_sampling=GREEDY,
                    bindings={"q": Binding(value="when do trains leave?")},
                ),
                CallSpec(
                    template=DOCS + "Question:{{input:rq}}\nAnswer:{{output:a}}",
                    default_sampling=GREEDY,
                    bindings={"rq": Binding(var_id="c0~rq")},
                ),
            ]
            manager.submit(session, SubmitRequest(calls=calls))
            await manager.get_variable(session, "c1~a")
            # Another session asks over the same documents: it reuses the answer's prefix.
            created2 = manager.create_session("key")
            session2 = manager.session(created2.session_id, created2.token)
            again = CallSpec(
                template=DOCS + "Question:{{input:rq}}\nAnswer:{{output:a}}",
                default_sampling=GREEDY,
                bindings={"rq": Binding(value=" who reviews hotfixes?")},
            )
            manager.submit(session2, SubmitRequest(calls=[again]))
            await manager.get_variable(session2, "c0~a")
            await asyncio.sleep(0)
            after = await tiny_engine.stats()
            first, other = manager.status(session), manager.status(session2)
            rewrite, answer = first.calls
            (reuser,) = other.calls
            assert rewrite.num_cached_tokens == rewrite.num_early_filled_tokens == 0
            # The answer computed its document prefix itself, early: none of it counts as reused.
            assert answer.num_cached_tokens == 0
            assert 0 < answer.num_early_filled_tokens < answer.num_computed_tokens == answer.num_prompt_tokens
            # The other session's call reused exactly what the answer computed early.
            assert reuser.num_cached_tokens == answer.num_early_filled_tokens
            assert reuser.num_computed_tokens == reuser.num_prompt_tokens - reuser.num_cached_tokens
            calls_all = [rewrite, answer, reuser]
            # Every prompt token the engine computed belongs to exactly one call, and it sampled
            # exactly the calls' generated tokens.
            assert after.num_prefill_tokens - before.num_prefill_tokens == sum(c.num_computed_tokens for c in calls_all)
            assert after.num_decode_tokens - before.num_decode_tokens == sum(c.num_generated_tokens for c in calls_all)
            assert [
                (e.engine_id, e.num_computed_tokens, e.num_cached_tokens, e.num_generated_tokens) for e in first.engines
            ] == [("e0", rewrite.num_computed_tokens + answer.num_computed_tokens, 0, 10)]
        finally:
            await manager.stop()

    asyncio.run(main())
