"""The benchmark's servers as context managers, and request-client factories for each (run.py, step_profile.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from benchmarks.baselines import OpenAIClient, RequestClient, SessionClient
from benchmarks.configs import Plan
from benchmarks.deploy import LocalServer, ManagerServer, ServerSpec, UpstreamServer, UpstreamSpec
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
