"""The manager frees a context with one request, never a retry loop: an engine frees a context
that still has work (a generation, a fork waiting to read it) when that work ends."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest
from fake_engine import FakeEngine

from parrot.protocol.engine_api import ExtendRequest, FreeContextRequest
from parrot.protocol.engine_client import extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import LimitsConfig, ManagerConfig, SharingConfig
from parrot.serve.manager import create_manager
from parrot.serve.runtime.contexts import free_engine_context


class CountingEngine(FakeEngine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.num_frees: collections.Counter[str] = collections.Counter()

    async def free(self, req: FreeContextRequest) -> None:
        self.num_frees[req.context_id] += 1
        await super().free(req)


def test_a_generating_context_is_freed_with_one_request_when_it_ends(tiny_model_folder: Path) -> None:
    engine = CountingEngine(tiny_model_folder, responder=lambda p: " a b c d", token_delay_s=0.01)

    async def main() -> None:
        await extend_only(engine, ExtendRequest(context_id="c", token_ids=[5, 6, 7]))
        stream = engine.extend(ExtendRequest(context_id="c", append=True, sampling=SamplingParams(max_tokens=8)))
        await anext(stream)  # generating
        await free_engine_context(engine, "c")  # accepted at once: nothing to wait for or retry
        assert [engine.num_frees["c"], "c" in engine.contexts] == [1, True]
        with pytest.raises(ParrotError) as info:  # being freed: as if gone
            await engine.free(FreeContextRequest(context_id="c"))
        assert info.value.status == 404
        events = [e async for e in stream]
        assert [events[-1].finish_reason, "c" in engine.contexts] == ["eos", False]
        assert [op for _, op, c, _ in engine.log if c == "c"] == ["fill", "generate", "generated", "free"]

    asyncio.run(main())


def test_a_call_cut_off_mid_generation_frees_each_context_once(tiny_model_folder: Path) -> None:
    engine = CountingEngine(tiny_model_folder, responder=lambda p: " tick" * 40, token_delay_s=0.05)

    async def main() -> None:
        manager = create_manager(
            [engine],
            config=ManagerConfig(limits=LimitsConfig(call_deadline_s=0.3), sharing=SharingConfig(prefix_sharing=False)),
        )
        await manager.start()
        try:
            created = manager.create_session("key")
            session = manager.session(created.session_id, created.token)
            spec = CallSpec(template="Go:{{output:o}}", default_sampling=SamplingParams(max_tokens=64))
            manager.submit(session, SubmitRequest(calls=[spec]))
            with pytest.raises(ParrotError):
                await manager.get_variable(session, "c0~o")
            await manager.drain()
            assert [engine.contexts, sorted(set(engine.num_frees.values()))] == [{}, [1]]
        finally:
            await manager.stop()

    asyncio.run(main())
