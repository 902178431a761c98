"""The OpenAI engine adapter over a real upstream: Parrot's own OpenAI-compatible server (a manager
over a tiny-model engine) on 127.0.0.1, no mocks. A manager whose only engine is the adapter gives
the builtin engine's greedy outputs; forks see their parent's tokens; errors name their field;
an upstream that goes away is EngineUnavailable and the manager keeps serving on the others."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import pytest
from live_server import LiveServer, serve_app, start_tiny_engine

from parrot.backends.connect import connect_engine
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.launch import OpenAIUpstream, start_embedded
from parrot.protocol.engine_api import ExtendRequest, Filled, FreeContextRequest, TokenEvent
from parrot.protocol.engine_client import EngineClient, EngineUnavailable, extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import AuthConfig, EnginesConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.text import Tokenizer

SMALL = SamplingParams(max_tokens=4, ignore_eos=True)
GUIDE = "You are a careful assistant. Read the part below and write one short line about it, nothing else. " * 2


@contextmanager
def upstream(engine: AsyncEngine, config: ManagerConfig | None = None) -> Iterator[str]:
    """Parrot's OpenAI-compatible server over `engine`: the adapter's upstream."""
    with serve_app(create_app(create_manager([engine], config=config), connect_engine=connect_engine)) as (url, _):
        yield url


@pytest.fixture(scope="module")
def upstream_engine(tiny_model_folder: Path) -> Iterator[AsyncEngine]:
    engine = start_tiny_engine(tiny_model_folder)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def upstream_url(upstream_engine: AsyncEngine) -> Iterator[str]:
    with upstream(upstream_engine) as url:
        yield url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def adapter(url: str, folder: Path, **kwargs: object) -> OpenAIEngineClient:
    return OpenAIEngineClient(url, api_key="k", tokenizer_folder=folder, **kwargs)  # type: ignore[arg-type]


def map_call(var_id: str) -> CallSpec:
    return CallSpec(
        template=GUIDE + "Part: {{input:p}}\nLine:{{output:s}}",
        bindings={"p": Binding(var_id=var_id)},
        default_sampling=SMALL,
    )


async def run_dag(manager: Manager) -> list[str]:
    """Two maps sharing a long instruction (the manager forks both from a cached prefix context),
    then a reduce of their outputs: a 2-level DAG run without the client."""
    created = manager.create_session("k")
    session = manager.session(created.session_id, created.token)
    reduce_call = CallSpec(
        template="Join {{input:a}} and {{input:b}} into one line:{{output:j}}",
        bindings={"a": Binding(var_id="c0~s"), "b": Binding(var_id="c1~s")},
        default_sampling=SMALL,
    )
    parts = [
        VariableSpec(var_id="p1", value="The river floods every spring."),
        VariableSpec(var_id="p2", value="The harbor freezes every winter."),
    ]
    manager.submit(session, SubmitRequest(variables=parts, calls=[map_call("p1"), map_call("p2"), reduce_call]))
    values = [(await manager.get_variable(session, v)).value for v in ("c0~s", "c1~s", "c2~j")]
    await manager.delete_session(session)
    await manager.drain()
    return [str(v) for v in values]


def test_a_dag_over_the_adapter_matches_the_builtin_engine(
    upstream_url: str, tiny_engine: AsyncEngine, tiny_model_folder: Path
) -> None:
    async def main() -> None:
        client = adapter(upstream_url, tiny_model_folder)
        over_adapter = create_manager([client])
        builtin = create_manager([tiny_engine])
        for manager in (over_adapter, builtin):
            await manager.start()
        assert over_adapter.pool.models == ["tiny"]
        assert over_adapter.pool.handles["e0"].max_model_len == 4096  # from the upstream's model card
        got, expected = await run_dag(over_adapter), await run_dag(builtin)
        assert got == expected and all(got), got
        # The maps forked from one cached prefix context, which outlives the session by design.
        [entry] = over_adapter.prefix_cache.entries("e0")
        assert (await client.stats()).num_contexts == 1
        assert client.context_info(entry.context_id).num_tokens == entry.num_tokens
        for manager in (over_adapter, builtin):
            await manager.stop()
        stats = await client.stats()
        assert [stats.num_contexts, stats.num_running, stats.num_blocks_free] == [0, 0, stats.num_blocks_total]
        assert stats.num_decode_tokens == 3 * SMALL.max_tokens
        # Parrot's own server refuses vLLM's `return_token_ids`: the ids came under `logprobs: 0`.
        assert client._upstream.ids_without_logprobs is False
        await client.aclose()

    asyncio.run(main())


def test_fork_then_generate_sees_the_parents_tokens(
    upstream_url: str, tiny_engine: AsyncEngine, tiny_model_folder: Path
) -> None:
    tok = Tokenizer(tiny_model_folder)
    prompt, more = tok.encode("The capital of France is"), tok.encode(" and then")

    async def steps(engine: EngineClient, prefix: str) -> list[list[TokenEvent]]:
        """Fill a, generate into a; fork b from a with more tokens, generate; fork c from b and generate."""
        a, b, c = f"{prefix}a", f"{prefix}b", f"{prefix}c"
        await extend_only(engine, ExtendRequest(context_id=a, token_ids=prompt))
        runs = [[e async for e in engine.extend(ExtendRequest(context_id=a, append=True, sampling=SMALL))]]
        await extend_only(engine, ExtendRequest(context_id=b, parent_context_id=a, token_ids=more))
        runs.append([e async for e in engine.extend(ExtendRequest(context_id=b, append=True, sampling=SMALL))])
        fork = ExtendRequest(context_id=c, parent_context_id=b, sampling=SMALL)
        runs.append([e async for e in engine.extend(fork)])
        for context_id in (a, b, c):
            await engine.free(FreeContextRequest(context_id=context_id))
        return runs

    async def main() -> None:
        client = adapter(upstream_url, tiny_model_folder)
        got, expected = await steps(client, "x-"), await steps(tiny_engine, "ref-")
        for g, e in zip(got, expected, strict=True):
            assert [x.token_id for x in g if x.token_id is not None] == [x.token_id for x in e]
            assert "".join(x.text for x in g) == "".join(x.text for x in e)
            assert [x.finish_reason for x in g][-1] == e[-1].finish_reason == "length"
            logprobs = [x.logprob for x in g if x.token_id is not None]
            assert logprobs == pytest.approx([x.logprob for x in e], abs=1e-4)
        # What the adapter held: b = a's prompt + a's 4 generated tokens + 3 more + b's 4 generated.
        await extend_only(client, ExtendRequest(context_id="p", token_ids=prompt))
        [_ async for _ in client.extend(ExtendRequest(context_id="p", append=True, sampling=SMALL))]
        await extend_only(client, ExtendRequest(context_id="q", parent_context_id="p", token_ids=more))
        info = client.context_info("q")
        assert [info.parent_context_id, info.num_tokens] == ["p", len(prompt) + 4 + len(more)]
        await client.aclose()

    asyncio.run(main())


def test_bad_requests_get_the_builtin_engines_errors(
    upstream_engine: AsyncEngine, upstream_url: str, tiny_model_folder: Path
) -> None:
    async def status_field(coro: object) -> list[object]:
        with pytest.raises(ParrotError) as info:
            await coro  # type: ignore[misc]
        return [info.value.status, info.value.field]

    async def generate(client: OpenAIEngineClient, req: ExtendRequest) -> list[TokenEvent]:
        return [e async for e in client.extend(req)]

    async def main() -> None:
        client = adapter(upstream_url, tiny_model_folder)
        await extend_only(client, ExtendRequest(context_id="a", token_ids=[1, 2, 3]))
        gen = ExtendRequest(context_id="nope", append=True, sampling=SMALL)
        assert await status_field(generate(client, gen)) == [404, "context_id"]
        await extend_only(client, ExtendRequest(context_id="e", token_ids=[9]))
        duplicate = ExtendRequest(context_id="a", parent_context_id="e", token_ids=[4])
        assert await status_field(extend_only(client, duplicate)) == [409, "context_id"]
        orphan = ExtendRequest(context_id="b", parent_context_id="nope", token_ids=[4])
        assert await status_field(extend_only(client, orphan)) == [404, "parent_context_id"]
        assert await status_field(client.free(FreeContextRequest(context_id="nope"))) == [404, "context_id"]
        assert await status_field(extend_only(client, ExtendRequest(context_id="c", token_ids=[-1]))) == [
            400,
            "token_ids",
        ]
        full = ExtendRequest(context_id="full", token_ids=[5] * 4096, sampling=SMALL)  # nothing to generate into
        assert await status_field(generate(client, full)) == [400, "context_id"]
        with pytest.raises(ParrotError):  # refused before the context changed: it was never made
            client.context_info("full")
        too_long = ExtendRequest(context_id="a", token_ids=[5] * 4094, append=True)
        assert await status_field(extend_only(client, too_long)) == [400, "token_ids"]
        # Free while generating: accepted, the context goes when the stream ends (a second free is
        # a 404); once the reader closed the stream, the upstream stops generating (the request is
        # dropped, not read to its end).
        decoded_before = upstream_engine.engine.stats().num_decode_tokens
        long = SamplingParams(max_tokens=2000, ignore_eos=True)
        stream = client.extend(ExtendRequest(context_id="a", append=True, sampling=long))
        await anext(stream)
        await client.free(FreeContextRequest(context_id="a"))
        assert await status_field(client.free(FreeContextRequest(context_id="a"))) == [404, "context_id"]
        assert client.context_info("a").context_id == "a"  # held until its generation ends
        await stream.aclose()  # type: ignore[attr-defined]
        with pytest.raises(ParrotError, match="unknown context 'a'"):
            client.context_info("a")  # dropped when its generation ended
        assert (await client.stats()).num_running == 0
        deadline = time.monotonic() + 10
        while upstream_engine.engine.stats().num_running:
            assert time.monotonic() < deadline, "the upstream kept generating for a closed stream"
            await asyncio.sleep(0.02)
        assert upstream_engine.engine.stats().num_decode_tokens - decoded_before < 2000
        # An upstream 4xx keeps its status and message: a token id outside the vocabulary...
        vocab_size = Tokenizer(tiny_model_folder).vocab_size
        await extend_only(client, ExtendRequest(context_id="v", token_ids=[vocab_size + 5]))
        with pytest.raises(ParrotError) as info:
            await generate(client, ExtendRequest(context_id="v", append=True, sampling=SMALL))
        assert info.value.status == 400 and "outside the vocabulary" in info.value.message
        assert client.context_info("v").num_tokens == 1  # unchanged
        # A fork that a failed generation was to create leaves nothing behind.
        with pytest.raises(ParrotError):
            await generate(client, ExtendRequest(context_id="w", parent_context_id="v", sampling=SMALL))
        with pytest.raises(ParrotError) as info:
            client.context_info("w")
        assert [info.value.status, info.value.field] == [404, "context_id"]
        # ... a missing key where the upstream needs one, and a model it does not serve (checked
        # at the first stats).
        with upstream(
            upstream_engine,
            ManagerConfig(auth=AuthConfig(api_keys=("k",)), sharing=SharingConfig(prefix_sharing=False)),
        ) as keyed_url:
            keyless = OpenAIEngineClient(keyed_url, tokenizer_folder=tiny_model_folder)
            assert (await status_field(keyless.stats()))[0] == 401
        wrong = adapter(upstream_url, tiny_model_folder, model="gpt-5")
        assert await status_field(wrong.stats()) == [404, "model"]
        for c in (client, keyless, wrong):
            await c.aclose()

    asyncio.run(main())


def test_an_upstream_that_goes_away_is_unavailable_and_the_manager_keeps_serving(
    upstream_engine: AsyncEngine, upstream_url: str, tiny_model_folder: Path
) -> None:
    # A second upstream over the same engine (no cached prefixes there, so no context ids collide).
    doomed_server: AbstractContextManager[str] = upstream(
        upstream_engine, ManagerConfig(sharing=SharingConfig(prefix_sharing=False))
    )
    doomed_url = doomed_server.__enter__()
    config = ManagerConfig(engines=EnginesConfig(heartbeat_interval_s=0.1, engine_dead_after_s=1.0))

    async def main() -> None:
        doomed, alive = adapter(doomed_url, tiny_model_folder), adapter(upstream_url, tiny_model_folder)
        manager = create_manager([doomed, alive], config=config)
        await manager.start()
        before = await run_dag(manager)
        await asyncio.to_thread(doomed_server.__exit__, None, None, None)
        await extend_only(doomed, ExtendRequest(context_id="a", token_ids=[1, 2, 3]))  # contexts are the adapter's
        with pytest.raises(EngineUnavailable):
            [_ async for _ in doomed.extend(ExtendRequest(context_id="a", append=True, sampling=SMALL))]
        with pytest.raises(EngineUnavailable):
            await doomed.stats()
        assert await run_dag(manager) == before  # re-dispatched to the live upstream if need be
        deadline = time.monotonic() + 10
        while manager.pool.handles["e0"].alive:
            assert time.monotonic() < deadline, "the dead upstream's adapter was never declared dead"
            await asyncio.sleep(0.05)
        assert await run_dag(manager) == before
        await manager.stop()
        for c in (doomed, alive):
            await c.aclose()

    try:
        asyncio.run(main())
    finally:
        doomed_server.__exit__(None, None, None)


def test_register_an_openai_upstream_while_serving(
    server: LiveServer, upstream_url: str, upstream_engine: AsyncEngine
) -> None:
    folder = str(server.engine.model_folder)
    key = {"Authorization": "Bearer k"}
    good = {"url": upstream_url, "kind": "openai", "model": "tiny", "tokenizer": folder, "api_key": "k"}
    keyed = upstream(
        upstream_engine, ManagerConfig(auth=AuthConfig(api_keys=("k",)), sharing=SharingConfig(prefix_sharing=False))
    )
    with httpx.Client(base_url=server.url, timeout=60, headers=key) as http, keyed as keyed_url:
        faults = [
            ({"url": upstream_url, "model": "tiny"}, 400, "model"),  # kind "parrot" says its own
            (good | {"kind": "vllm"}, 400, "kind"),
            (good | {"tokenizer": "/nonexistent"}, 400, "tokenizer"),
            ({k: v for k, v in good.items() if k != "tokenizer"}, 400, "tokenizer"),  # Parrot's card has no root
            (good | {"url": keyed_url, "api_key": None}, 400, "api_key"),  # the upstream wants one
            (good | {"model": "gpt-5"}, 404, "model"),
            (good | {"url": f"http://127.0.0.1:{free_port()}"}, 400, "url"),
        ]
        for body, status, field in faults:
            got = http.post("/v1/engines", json=body)
            assert [got.status_code, got.json()["error"]["field"]] == [status, field], (body, got.text)
        got = http.post("/v1/engines", json=good)
        assert got.status_code == 201, got.text
        assert [got.json()[k] for k in ("engine_id", "url", "model", "alive")] == ["e1", upstream_url, "tiny", True]
        again = http.post("/v1/engines", json=good)
        assert [again.status_code, again.json()["error"]["field"]] == [409, "url"]
        handle = server.manager.pool.handles["e1"]
        assert isinstance(handle.client, OpenAIEngineClient)
        assert handle.tokenizer is server.manager.pool.handles["e0"].tokenizer  # one per folder


def test_embedded_mode_serves_over_an_openai_upstream(upstream_url: str, tiny_model_folder: Path) -> None:
    """`parrot serve --no-builtin --openai-engine URL ...`: the launcher's path, without a builtin engine."""
    attached = OpenAIUpstream(upstream_url, model="tiny", tokenizer=str(tiny_model_folder), api_key="k")
    with start_embedded([], openai_upstreams=[attached]) as embedded:
        assert embedded.engines == []
        request = {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}
        texts = []
        for url in (embedded.url, upstream_url):  # through the adapter; the upstream itself
            got = httpx.post(f"{url}/v1/completions", json=request, headers={"Authorization": "Bearer k"}, timeout=60)
            assert got.status_code == 200, got.text
            texts.append(got.json()["choices"][0]["text"])
        assert texts[0] == texts[1] and texts[0]


def test_a_stop_string_is_cut_out_of_the_adapters_context(
    upstream_url: str, tiny_engine: AsyncEngine, tiny_model_folder: Path
) -> None:
    """The upstream streams the stop string's tokens, not its text: the adapter cuts them as the
    builtin engine does (the text before the stop in the first cut token re-tokenized)."""
    tok = Tokenizer(tiny_model_folder)
    rng = random.Random(7)
    prompt = [rng.randrange(3, 40000) for _ in range(9)]  # the tiny model's output varies after these
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)

    async def run(engine: EngineClient, context_id: str, sampling: SamplingParams) -> list[TokenEvent]:
        await extend_only(engine, ExtendRequest(context_id=context_id, token_ids=prompt))
        return [e async for e in engine.extend(ExtendRequest(context_id=context_id, append=True, sampling=sampling))]

    async def main() -> None:
        client = adapter(upstream_url, tiny_model_folder)
        free_run = await run(client, "free", greedy)
        ids = [e.token_id for e in free_run if e.token_id is not None]
        assert free_run[-1].output_token_ids == ids
        pieces = [tok.decode(ids[: k + 1])[len(tok.decode(ids[:k])) :] for k in range(len(ids))]
        text = "".join(pieces)
        # A token of two or more characters, past the first, whose text first occurs where it stands.
        i = next(
            k
            for k in range(2, len(ids) - 1)
            if len(pieces[k]) >= 2 and text.index(pieces[k] + pieces[k + 1]) == len("".join(pieces[:k]))
        )
        stop = greedy.model_copy(update={"stop": [pieces[i][1:] + pieces[i + 1]]})
        got, expected = await run(client, "cut", stop), await run(tiny_engine, "ref-cut", stop)
        kept = ids[:i] + tok.encode(pieces[i][:1])
        assert "".join(e.text for e in got) == "".join(pieces[:i]) + pieces[i][:1]
        assert [got[-1].finish_reason, got[-1].output_token_ids] == ["stop", kept]
        assert expected[-1].output_token_ids == kept
        info = client.context_info("cut")
        assert info.num_tokens == len(prompt) + len(kept)
        await extend_only(client, ExtendRequest(context_id="after", parent_context_id="cut", token_ids=[]))
        for context_id in ("free", "cut", "after"):
            await client.free(FreeContextRequest(context_id=context_id))
        await tiny_engine.free(FreeContextRequest(context_id="ref-cut"))
        assert (await client.stats()).num_blocks_free == (await client.stats()).num_blocks_total
        await client.aclose()

    asyncio.run(main())


def test_an_extend_with_tokens_and_sampling_matches_fill_then_generate(
    upstream_url: str, tiny_engine: AsyncEngine, tiny_model_folder: Path
) -> None:
    """Tokens and sampling in one Extend over the adapter: create, fork and append, each one
    request; the same tokens as the builtin engine's, the first event saying what the tokens did;
    bad tokens are the fill's error, nothing held. Without sampling: one `filled` event."""
    tok = Tokenizer(tiny_model_folder)
    prompt, more = tok.encode("The capital of France is"), tok.encode(" and then")

    async def steps(engine: EngineClient, prefix: str) -> list[list[int]]:
        a, b = f"{prefix}a", f"{prefix}b"
        requests = [
            ExtendRequest(context_id=a, token_ids=prompt, sampling=SMALL),
            ExtendRequest(context_id=b, parent_context_id=a, token_ids=more, sampling=SMALL),
            ExtendRequest(context_id=a, token_ids=more, append=True, sampling=SMALL),
        ]
        events = [[e async for e in engine.extend(r)] for r in requests]
        runs = [[e.token_id for e in r if e.token_id is not None] for r in events]
        # The first event says what the tokens did (the count computed differs: the adapter computes none itself).
        filled = [r[0].filled for r in events]
        after_a = len(prompt) + 4 + len(more)
        assert [f.num_tokens if f else None for f in filled] == [len(prompt), after_a, after_a]
        for context_id in (a, b):
            await engine.free(FreeContextRequest(context_id=context_id))
        return runs

    async def main() -> None:
        client = adapter(upstream_url, tiny_model_folder)
        got, expected = await steps(client, "x-"), await steps(tiny_engine, "ref-")
        assert got == expected and [len(r) for r in got] == [4, 4, 4]
        events = [e async for e in client.extend(ExtendRequest(context_id="h", token_ids=prompt))]
        filled = Filled(num_tokens=len(prompt), num_filled_tokens=len(prompt))  # computed by the upstream later
        assert [(e.token_id, e.finish_reason, e.filled) for e in events] == [(None, "filled", filled)]
        with pytest.raises(ParrotError) as e:
            [_ async for _ in client.extend(ExtendRequest(context_id="h", token_ids=more, sampling=SMALL))]
        assert [e.value.status, e.value.field] == [409, "context_id"]
        bad = ExtendRequest(context_id="n", parent_context_id="gone", token_ids=more, sampling=SMALL)
        with pytest.raises(ParrotError) as e:
            [_ async for _ in client.extend(bad)]
        assert [e.value.status, e.value.field] == [404, "parent_context_id"]
        assert client.context_info("h").num_tokens == len(prompt)
        with pytest.raises(ParrotError):
            client.context_info("n")
        await client.free(FreeContextRequest(context_id="h"))
        await client.aclose()

    asyncio.run(main())
