"""The benchmark's servers as context managers, request-client factories for each, their warm-up, and
Parrot's latency target from baseline (a)'s warm server (run.py, step_profile.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from benchmarks.apps.baselines import OpenAIClient, RequestClient, SessionClient
from benchmarks.apps.configs import LATENCY_CAP_TOKENS, Plan, step_ms_at
from benchmarks.apps.deploy import LocalServer, ManagerServer, ServerSpec, UpstreamServer, UpstreamSpec, warm_up
from parrot.launch import OpenAIUpstream

S = TypeVar("S", bound=ManagerServer)


def server_spec(plan: Plan, name: str) -> ServerSpec:
    return next(s for s in plan.specs if s.name == name)


def parrot_over(upstream: OpenAIUpstream, parrot: ServerSpec) -> UpstreamSpec:
    """Parrot+vLLM: the Parrot configuration's manager settings over `upstream` (one engine)."""
    return UpstreamSpec("parrot_vllm", upstream, parrot.manager)


def running(spec: ServerSpec) -> contextlib.AbstractContextManager[LocalServer]:
    print(f"starting {spec.name} ...", flush=True)
    return serving(LocalServer(spec))


def running_upstream(spec: UpstreamSpec) -> contextlib.AbstractContextManager[UpstreamServer]:
    print(f"starting {spec.name} (a manager over {spec.upstream.url}) ...", flush=True)
    return serving(UpstreamServer(spec))


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def openai_factory(url: str, model: str) -> Callable[[], RequestClient]:
    return lambda: OpenAIClient(url, model)


def session_factory(url: str, model: str) -> Callable[[], RequestClient]:
    return lambda: SessionClient(url)


async def warm_all(
    servers: dict[str, ManagerServer],
    clients: dict[str, Callable[[], RequestClient]],
    prompt: str,
    thorough: set[str] | None = None,
) -> None:
    """Warm each server (all of `thorough`, default all, with every shape class; kernels are per
    process, so the others need only their first request)."""
    for name in servers:
        client = clients[name]()
        try:
            if thorough is None or name in thorough:
                await warm_up(client.complete, prompt)
            else:
                await client.complete(prompt[:200], 4)
        finally:
            await client.aclose()


WARM_PROMPT = "The history of the nation is the story of its people. " * 30


def latency_target(lat: ManagerServer, client: Callable[[], RequestClient]) -> tuple[float | None, dict[int, float]]:
    """Warm baseline (a)'s server; its step time at the latency cap becomes Parrot's latency target
    (so Parrot and (a) aim at the same time per output token). Returns (target ms, step profile)."""
    asyncio.run(warm_all({"lat": lat}, {"lat": client}, WARM_PROMPT))
    profile = dict(getattr(lat.stats(), "step_ms_by_num_tokens", {}))
    return step_ms_at(profile, LATENCY_CAP_TOKENS), profile
