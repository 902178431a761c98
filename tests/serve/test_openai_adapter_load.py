"""What Parrot sends an upstream through the OpenAI adapter, against a fake vLLM (fake_openai.py):
no more prompt tokens than plain requests for the same app; each call's objective and priority as
vLLM's request `priority` (dropped, once, by an upstream that refuses it); a step profile
learned from the time per output token, from which the manager calibrates its latency cap; and no
heartbeat request while tokens stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from live_server import serve_app

from benchmarks.peers.fake_openai import FakeOpenAI
from parrot.backends.openai_dialect import upstream_priority
from parrot.backends.openai_engine import HEARD_S, UNWATCHED_STREAM_INTERVAL, OpenAIEngineClient
from parrot.frontend import AsyncSession, SemanticFunction
from parrot.protocol.engine_api import ExtendRequest
from parrot.protocol.engine_client import EngineUnavailable, extend_only
from parrot.protocol.objective import Criteria, Objective
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import EnginesConfig, SchedulingConfig
from parrot.serve.policy.capacity import calibrate_latency_cap
from parrot.web.server_thread import ServerThread

SMALL = SamplingParams(max_tokens=4, ignore_eos=True)
GUIDE = "You are a careful assistant. Read the part below and write one short line about it, nothing else. " * 2
PARTS = ["The river floods every spring.", "The harbor freezes every winter.", "The hills burn every summer."]
MAP = GUIDE + "Part: {{input:p}}\nLine:{{output:s}}"
REDUCE = "Join {{input:a}}, {{input:b}} and {{input:c}} into one line:{{output:j}}"
SHORTEN = "Shorten: {{input:j}}\nShort:{{output:t}}"


def app_calls() -> SubmitRequest:
    """Three maps sharing a long instruction, their reduce, then a call on the reduce's output."""
    maps = [CallSpec(template=MAP, bindings={"p": Binding(var_id=f"p{i}")}, default_sampling=SMALL) for i in range(3)]
    reduce_bindings = {name: Binding(var_id=f"c{i}~s") for i, name in enumerate("abc")}
    return SubmitRequest(
        variables=[VariableSpec(var_id=f"p{i}", value=part) for i, part in enumerate(PARTS)],
        calls=[
            *maps,
            CallSpec(template=REDUCE, bindings=reduce_bindings, default_sampling=SMALL),
            CallSpec(template=SHORTEN, bindings={"j": Binding(var_id="c3~j")}, default_sampling=SMALL),
        ],
    )


async def run_over_parrot(
    fake: FakeOpenAI, url: str, *, stream_last: bool = False, **adapter: bool
) -> tuple[OpenAIEngineClient, list[object]]:
    """The app on a manager whose one engine is the adapter over `url`: a person awaits the last
    output (`stream_last`: streams it, from before any call is dispatched). Returns the adapter and
    each call's (objective, priority) as the manager deduced them."""
    client = OpenAIEngineClient(url, tokenizer_folder=fake.folder, **adapter)
    manager = create_manager([client])
    await manager.start()
    created = manager.create_session("k")
    session = manager.session(created.session_id, created.token)
    manager.submit(session, app_calls())
    manager.note_criteria(session, session.graph.variables["c4~t"], Criteria.LATENCY)
    if stream_last:
        chunks = await manager.stream_variable(session, "c4~t")
        assert "".join([c async for c in chunks]) == " ok" * 4
    assert (await manager.get_variable(session, "c4~t")).value == " ok" * 4
    deduced = [[session.runs[f"c{i}"].objective, session.runs[f"c{i}"].priority] for i in range(5)]
    await manager.delete_session(session)
    await manager.stop()
    return client, deduced


@contextmanager
def openai_routes_over(fake: FakeOpenAI) -> Iterator[str]:
    """Parrot's HTTP app (its OpenAI routes) over a manager whose engine is the adapter over `fake`."""
    with serve_app(fake.app()) as (url, _):
        manager = create_manager([OpenAIEngineClient(url, tokenizer_folder=fake.folder)])
        with serve_app(create_app(manager)) as (parrot_url, _):
            yield parrot_url


async def run_as_plain_requests(url: str) -> None:
    """The same app as a request-level client runs it: each prompt rendered, one request per call."""
    async with httpx.AsyncClient(base_url=url) as http:

        async def complete(prompt: str) -> str:
            body = {"model": "fake", "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
            return str((await http.post("/v1/completions", json=body)).json()["choices"][0]["text"])

        lines = await asyncio.gather(*(complete(GUIDE + f"Part: {p}\nLine:") for p in PARTS))
        joined = await complete(f"Join {lines[0]}, {lines[1]} and {lines[2]} into one line:")
        await complete(f"Shorten: {joined}\nShort:")


def test_parrot_sends_no_more_prompt_tokens_than_plain_requests(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder)
    with serve_app(fake.app()) as (url, _):
        asyncio.run(run_over_parrot(fake, url))
        parrot = [fake.prompt_tokens(b) for b in fake.bodies]
        fake.bodies.clear()
        asyncio.run(run_as_plain_requests(url))
        plain = [fake.prompt_tokens(b) for b in fake.bodies]
    # The same five prompts, token for token: the cached prefix the maps fork from costs nothing
    # upstream (the adapter's fill is local; the upstream's prefix cache shares it).
    assert sorted(parrot) == sorted(plain)
    assert len(parrot) == 5
    assert sum(map(len, parrot)) == sum(map(len, plain))


def test_objectives_and_priorities_reach_the_upstream_as_its_priority(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder)
    with serve_app(fake.app()) as (url, _):
        client, deduced = asyncio.run(run_over_parrot(fake, url))
    # The maps are a task group (throughput) for a consumer a person awaits (priority 1); the
    # reduce and the last call are latency-critical with the same priority.
    t, lat = Objective.THROUGHPUT, Objective.LATENCY
    assert deduced == [[t, 1], [t, 1], [t, 1], [lat, 1], [lat, 1]]
    assert sorted(b.get("priority", 0) for b in fake.bodies) == [-1, -1, 2000, 2000, 2000]
    assert [upstream_priority(t, 1), upstream_priority(lat, 1), upstream_priority(lat, 0)] == [2000, -1, 0]
    assert client._upstream.send_priority is True


def test_an_upstream_that_refuses_priorities_gets_none_from_then_on(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder, priority_scheduling=False)  # vLLM's default FCFS scheduler
    with serve_app(fake.app()) as (url, _):
        client, _ = asyncio.run(run_over_parrot(fake, url))
    refused = [b["priority"] for b in fake.bodies if "priority" in b]
    # Every call ran once without the field; only requests sent before the first refusal had it.
    assert len(fake.bodies) - len(refused) == 5
    assert 1 <= len(refused) <= 3
    assert set(refused) == {2000}
    assert client._upstream.send_priority is False
    # A client told not to send priorities never does.
    fake.bodies.clear()
    with serve_app(fake.app()) as (url, _):
        asyncio.run(run_over_parrot(fake, url, send_priority=False))
    assert [len(fake.bodies), sum("priority" in b for b in fake.bodies)] == [5, 0]


def test_outputs_nobody_streams_come_in_chunks_of_16_tokens(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder)
    with serve_app(fake.app()) as (url, _):
        asyncio.run(run_over_parrot(fake, url))
        # Every output is read whole (by its consumer or a get): vLLM sends 16 tokens a chunk.
        assert [b.get("stream_interval") for b in fake.bodies] == [UNWATCHED_STREAM_INTERVAL] * 5
        fake.bodies.clear()
        asyncio.run(run_over_parrot(fake, url, stream_last=True))
        # The streamed output goes a token per chunk; the four before it as above.
        assert [b.get("stream_interval") for b in fake.bodies] == [UNWATCHED_STREAM_INTERVAL] * 4 + [None]
    # Parrot's OpenAI route over the adapter: a request with `stream` is watched, one without is not.
    fake.bodies.clear()
    with openai_routes_over(fake) as parrot_url:
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 4, "ignore_eos": True}
        with httpx.Client(base_url=parrot_url, headers={"Authorization": "Bearer k"}) as http:
            assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] == " ok" * 4
            with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as resp:
                assert resp.status_code == 200
                assert " ok" in resp.read().decode()
    assert [b.get("stream_interval") for b in fake.bodies] == [UNWATCHED_STREAM_INTERVAL, None]
    # An upstream spoken to in plain OpenAI gets no vLLM field.
    fake.bodies.clear()
    with serve_app(fake.app()) as (url, _):
        asyncio.run(run_over_parrot(fake, url, ask_token_ids=False))
    assert [len(fake.bodies), sum("stream_interval" in b for b in fake.bodies)] == [5, 0]


def test_logprobs_are_asked_of_vllm_only_where_someone_reads_them(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder)
    with serve_app(fake.app()) as (url, _):
        asyncio.run(run_over_parrot(fake, url))
    # The SDK reads text only: token ids without logprobs (they cost vLLM ~3% per token).
    assert [("logprobs" in b, b.get("return_token_ids")) for b in fake.bodies] == [(False, True)] * 5
    fake.bodies.clear()
    with openai_routes_over(fake) as parrot_url, httpx.Client(base_url=parrot_url) as http:
        headers = {"Authorization": "Bearer k"}
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 3, "ignore_eos": True}
        plain = http.post("/v1/completions", json=body, headers=headers).json()["choices"][0]
        with_0 = http.post("/v1/completions", json=body | {"logprobs": 0}, headers=headers).json()["choices"][0]
        chat = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "ignore_eos": True}
        chat_lp = http.post("/v1/chat/completions", json=chat | {"logprobs": True}, headers=headers).json()
        chat_plain = http.post("/v1/chat/completions", json=chat | {"logprobs": False}, headers=headers).json()
    assert [plain["text"], plain["logprobs"], with_0["text"]] == [" ok" * 3, None, " ok" * 3]
    assert with_0["logprobs"]["token_logprobs"] == [-0.1] * 3  # the upstream's, for the asked tokens
    content = chat_lp["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in content] == [(" ok", -0.1)] * 3
    assert chat_plain["choices"][0]["logprobs"] is None
    asked = [(b.get("logprobs"), b.get("return_tokens_as_token_ids"), b.get("return_token_ids")) for b in fake.bodies]
    assert asked == [(None, None, True), (0, True, None), (0, True, None), (None, None, True)]


def test_echo_with_logprobs_over_an_engine_that_cannot_score_is_a_400_naming_echo(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder)
    with openai_routes_over(fake) as parrot_url:
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 4, "echo": True, "logprobs": 1}
        resp = httpx.post(f"{parrot_url}/v1/completions", json=body, headers={"Authorization": "Bearer k"})
    assert [resp.status_code, resp.json()["error"]["param"]] == [400, "echo"]
    assert fake.bodies == []  # nothing was generated


def test_the_latency_cap_is_learned_from_the_observed_time_per_output_token(tiny_model_folder: Path) -> None:
    # A batching upstream: each token takes 10 ms plus 10 ms per request it serves at once.
    fake = FakeOpenAI(tiny_model_folder, step_ms=10.0, step_ms_per_request=10.0)
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)

    async def generate(client: OpenAIEngineClient, context_id: str) -> None:
        await extend_only(client, ExtendRequest(context_id=context_id, token_ids=[5, 6, 7]))
        [_ async for _ in client.extend(ExtendRequest(context_id=context_id, append=True, sampling=sampling))]

    async def main(url: str) -> None:
        client = OpenAIEngineClient(url, tokenizer_folder=tiny_model_folder)
        config = ManagerConfig(
            scheduling=SchedulingConfig(tpot_target_ms=35.0, tpot_floor_slack=1.0),
            engines=EnginesConfig(heartbeat_interval_s=1000.0),
        )
        manager = create_manager([client], config=config)
        await manager.start()
        handle = manager.pool.handles["e0"]
        assert [handle.stats.step_ms_by_num_tokens, handle.latency_cap] == [
            {},
            config.scheduling.initial_latency_cap_calls,
        ]
        await generate(client, "alone")
        await asyncio.gather(*(generate(client, f"four{i}") for i in range(4)))
        assert await manager.health.probe(handle)
        profile = handle.stats.step_ms_by_num_tokens
        # Gaps by concurrent generations: ~20 ms alone, ~50 ms four at once (the 4 bucket also
        # holds the 3 left when the first finishes).
        assert [1 in profile, 4 in profile, set(profile) <= {1, 2, 4}] == [True, True, True]
        assert profile[4] > 1.5 * profile[1]
        expected = calibrate_latency_cap(profile, 35.0, config.scheduling.initial_latency_cap_calls, 64, 1.0)
        # Four at once miss the 35 ms target: the cap is what the measurements allow, under four.
        assert [handle.latency_cap == expected, 1 <= handle.latency_cap < 4] == [True, True]
        await manager.stop()
        await client.aclose()

    with serve_app(fake.app()) as (url, _):
        asyncio.run(main(url))


def test_an_sdk_get_reaches_the_server_with_its_batch(tiny_model_folder: Path) -> None:
    # The SDK's get follows the submit in a request of its own, which may arrive after the maps are
    # dispatched: the batch names the awaited output (SubmitRequest.awaited), so the maps are
    # dispatched as a group whose consumer a person awaits (priority 1: vLLM priority 2000), never
    # as work nobody awaits (2001).
    fake = FakeOpenAI(tiny_model_folder)
    small = {"o": SMALL}
    map_fn = SemanticFunction("m", GUIDE + "Part: {{input:p}}\nLine:{{output:o}}", ["p"], small)
    reduce_fn = SemanticFunction("r", "Join {{input:a}}, {{input:b}}, {{input:c}}:{{output:o}}", ["a", "b", "c"], small)

    async def app(url: str) -> str:
        async with AsyncSession(url, api_key="k") as session:
            lines = [map_fn.invoke(session.core, part) for part in PARTS]
            return await reduce_fn.invoke(session.core, *lines).aget()

    with openai_routes_over(fake) as parrot_url:
        for _ in range(3):
            fake.bodies.clear()
            assert asyncio.run(app(parrot_url)) == " ok" * 4
            assert sorted(b.get("priority", 0) for b in fake.bodies) == [-1, 2000, 2000, 2000]


def test_a_token_streamed_within_heard_s_stands_for_the_heartbeats_request(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder, step_ms=40.0)  # 12 tokens: ~0.5 s of streaming
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)

    async def main(url: str) -> None:
        client = OpenAIEngineClient(url, tokenizer_folder=tiny_model_folder)
        await client.stats()  # the model card
        await client.stats()  # nothing streamed yet: a heartbeat request
        assert fake.num_model_reads == 2
        await extend_only(client, ExtendRequest(context_id="c", token_ids=[5, 6, 7]))
        events = client.extend(ExtendRequest(context_id="c", append=True, sampling=sampling))
        rest = []
        async for event in events:  # each token (40 ms apart) is the upstream's sign of life
            assert (await client.stats()).num_running == 1  # the stream closes after its last event
            rest.append(event)
        assert [len(rest), fake.num_model_reads] == [12, 2]
        await asyncio.sleep(HEARD_S + 0.05)  # quiet for HEARD_S: the heartbeat asks again
        await client.stats()
        assert fake.num_model_reads == 3
        await client.aclose()

    with serve_app(fake.app()) as (url, _):
        asyncio.run(main(url))


def test_an_upstream_refusing_new_requests_is_asked_though_its_open_stream_runs_on(tiny_model_folder: Path) -> None:
    fake = FakeOpenAI(tiny_model_folder, step_ms=40.0)
    server = ServerThread(fake.app(), graceful_shutdown_s=5, name="test-fake").start(timeout=60)

    async def main() -> None:
        client = OpenAIEngineClient(server.url, tokenizer_folder=tiny_model_folder)
        await client.stats()
        for context_id in ("long", "late"):
            await extend_only(client, ExtendRequest(context_id=context_id, token_ids=[5, 6, 7]))
        long = SamplingParams(max_tokens=60, ignore_eos=True)
        events = client.extend(ExtendRequest(context_id="long", append=True, sampling=long))
        await anext(events)
        server.server.should_exit = True  # a graceful shutdown: no new request, the open stream runs on
        await asyncio.sleep(0.3)  # uvicorn's main loop looks every 0.1 s
        with pytest.raises(EngineUnavailable):
            [_ async for _ in client.extend(ExtendRequest(context_id="late", append=True, sampling=SMALL))]
        await anext(events)  # a token after the refusal: not a sign of life until the upstream answers
        with pytest.raises(EngineUnavailable):
            await client.stats()
        await events.aclose()
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        server.stop()
