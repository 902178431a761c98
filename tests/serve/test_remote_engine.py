"""The manager drives an engine started separately, by URL, through HttpEngineClient."""

from __future__ import annotations

import asyncio
import time

import pytest

from parrot.backends.http_engine import HttpEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.app import create_engine_app
from parrot.protocol.engine_api import ExtendRequest, Filled, FreeContextRequest
from parrot.protocol.engine_client import extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve import create_manager
from parrot.web.server_thread import ServerThread

SMALL = SamplingParams(max_tokens=4, ignore_eos=True)


def test_manager_over_http_engine_matches_in_process(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as engine_server:

        async def main() -> None:
            remote = HttpEngineClient(engine_server.url)
            local = create_manager([tiny_engine])
            over_http = create_manager([remote])  # tokenizer folder from GET /v1/engine/info
            await local.start()
            await over_http.start()
            assert over_http.pool.models == ["tiny"]
            values = []
            for manager in (local, over_http):
                created = manager.create_session("k")
                session = manager.session(created.session_id, created.token)
                manager.submit(
                    session,
                    SubmitRequest(
                        variables=[VariableSpec(var_id="doc", value="A short document.")],
                        calls=[
                            CallSpec(
                                template="Summary of {{input:d}}:{{output:s}}",
                                bindings={"d": Binding(var_id="doc")},
                                default_sampling=SMALL,
                            ),
                            CallSpec(
                                template="Shorter: {{input:s}}:{{output:t}}",
                                bindings={"s": Binding(var_id="c0~s")},
                                default_sampling=SMALL,
                            ),
                        ],
                    ),
                )
                values.append([(await manager.get_variable(session, v)).value for v in ("c0~s", "c1~t")])
                await manager.delete_session(session)
                await manager.drain()
            assert values[0] == values[1]
            stats = await remote.stats()
            assert [stats.num_contexts, stats.num_blocks_free] == [0, stats.num_blocks_total]
            # Engine errors arrive with their status and field.
            with pytest.raises(ParrotError) as info:
                await remote.free(FreeContextRequest(context_id="nope"))
            assert [info.value.status, info.value.field] == [404, "context_id"]
            await local.stop()
            await over_http.stop()
            await remote.aclose()

        asyncio.run(main())


def test_extends_over_http_stream_ndjson_and_closing_a_generation_aborts_it(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as engine_server:

        async def main() -> None:
            remote = HttpEngineClient(engine_server.url)
            filled = await extend_only(remote, ExtendRequest(context_id="h-a", token_ids=[5, 6, 7, 8]))
            assert filled == Filled(num_tokens=4, num_filled_tokens=3)
            fork = ExtendRequest(context_id="h-b", parent_context_id="h-a", token_ids=[9], sampling=SMALL)
            events = [e async for e in remote.extend(fork)]
            assert [e.filled for e in events] == [Filled(num_tokens=5, num_filled_tokens=1), None, None, None]
            assert [e.finish_reason for e in events] == [None, None, None, "length"]
            # A reader that goes away: the engine stops generating (well before max_tokens), and the
            # context, freed meanwhile, goes when the generation ends.
            decoded = tiny_engine.engine.stats().num_decode_tokens
            long = SamplingParams(max_tokens=2000, ignore_eos=True)
            stream = remote.extend(ExtendRequest(context_id="h-b", append=True, sampling=long))
            assert (await anext(stream)).token_id is not None
            await stream.aclose()  # type: ignore[attr-defined]
            for context_id in ("h-a", "h-b"):
                await remote.free(FreeContextRequest(context_id=context_id))
            deadline = time.monotonic() + 30
            while "h-b" in tiny_engine.engine.contexts:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert tiny_engine.engine.stats().num_decode_tokens - decoded < 2000
            assert "h-a" not in tiny_engine.engine.contexts
            await remote.aclose()

        asyncio.run(main())
