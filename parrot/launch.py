"""Embedded mode: one process runs a manager and a builtin engine (the default deployment).

This is the one module that wires `parrot.serve` to `parrot.engine` (the layers never import each
other): it builds AsyncEngine(s), hands them to the manager as EngineClients, and serves the app.
Engines started separately join by URL (`--engine-url`); OpenAI-compatible servers such as vLLM
join through the adapter (`--openai-engine`, parrot/serve/openai_engine.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from parrot.backends.connect import connect_engine
from parrot.backends.http_engine import HttpEngineClient
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.model.loader import resolve_model_folder
from parrot.protocol.engine_api import ENGINE_SECRET_ENV
from parrot.protocol.engine_client import EngineClient
from parrot.serve.config import ManagerConfig
from parrot.serve.http.app import create_app
from parrot.serve.manager import Manager, create_manager
from parrot.web.server_thread import ServerThread


@dataclass(frozen=True)
class OpenAIUpstream:
    """An OpenAI-compatible completion server (vLLM) to serve through the engine adapter.

    `tokenizer`: a local folder with the model's tokenizer, or a model name this machine resolves
    (`smollm2-135m`: the default model's folder); None: the upstream model card's `root`, when
    that is a folder here (vLLM started on this machine with `--model <folder>`)."""

    url: str
    model: str | None = None
    tokenizer: str | None = None
    api_key: str | None = None
    stream_interval: int = 1  # tokens per streamed chunk asked of it (vLLM's stream_interval)

    def client(self) -> OpenAIEngineClient:
        folder = None
        if self.tokenizer is not None:
            path = Path(self.tokenizer)
            folder = path if (path / "tokenizer.json").is_file() else resolve_model_folder(self.tokenizer)
        return OpenAIEngineClient(self.url, self.model, self.api_key, folder, stream_interval=self.stream_interval)


@dataclass
class Embedded:
    """A running manager (+ builtin engines) behind an HTTP server on loopback."""

    server: ServerThread
    manager: Manager
    engines: list[AsyncEngine] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self, grace_s: float | None = 0.0) -> None:
        """Stop; with `grace_s` (None: the manager's `shutdown_grace_s`), first refuse new work and
        let calls in flight finish for that long. The app's lifespan then stops the manager: open
        sessions close (pending gets and streams end with a 410 error) and engine contexts free."""
        if grace_s is None or grace_s > 0:
            asyncio.run_coroutine_threadsafe(self.manager.drain_in_flight(grace_s), self.server.loop).result()
            # Before the server stops: open streams get their error event while connections last.
            asyncio.run_coroutine_threadsafe(self.manager.close_sessions(), self.server.loop).result()
        self.server.stop()
        for e in self.engines:
            e.stop()

    def __enter__(self) -> Embedded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded(
    engine_configs: list[EngineConfig] | None = None,
    engine_urls: list[str] | None = None,
    manager_config: ManagerConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    openai_upstreams: list[OpenAIUpstream] | None = None,
) -> Embedded:
    secret = os.environ.get(ENGINE_SECRET_ENV) or None
    clients: list[EngineClient] = [HttpEngineClient(u, secret=secret) for u in engine_urls or []]
    clients += [u.client() for u in openai_upstreams or []]
    engines = [AsyncEngine(cfg) for cfg in (engine_configs if engine_configs is not None else [EngineConfig()])]
    clients = [*engines, *clients]
    if not clients:
        raise ValueError("at least one engine (builtin, by URL or an OpenAI-compatible upstream) is needed")
    for e in engines:
        e.start()
    manager = create_manager(clients, config=manager_config)
    server = ServerThread(
        create_app(manager, connect_engine=functools.partial(connect_engine, engine_secret=secret)),
        host=host,
        port=port,
    )
    try:
        server.start(timeout=120)
    except Exception:
        for e in engines:
            e.stop()
        raise
    return Embedded(server, manager, engines)
