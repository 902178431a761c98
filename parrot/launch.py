"""Embedded mode: one process runs a manager and a builtin engine (the default deployment).

This is the one module that wires `parrot.serve` to `parrot.engine` (the layers never import each
other): it builds AsyncEngine(s), hands them to the manager as EngineClients, and serves the app.
Engines started separately join by URL (`--engine-url`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parrot.engine.api import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.server.launch import ServerThread
from parrot.serve.app import create_app
from parrot.serve.config import ManagerConfig
from parrot.serve.engine_client import EngineClient, HttpEngineClient
from parrot.serve.manager import Manager, create_manager


@dataclass
class Embedded:
    """A running manager (+ builtin engines) behind an HTTP server on loopback."""

    server: ServerThread
    manager: Manager
    engines: list[AsyncEngine] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()  # the app's lifespan stops the manager
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
) -> Embedded:
    engines = [AsyncEngine(cfg) for cfg in (engine_configs if engine_configs is not None else [EngineConfig()])]
    for e in engines:
        e.start()
    clients: list[EngineClient] = [*engines, *(HttpEngineClient(u) for u in engine_urls or [])]
    if not clients:
        raise ValueError("at least one engine (builtin or by URL) is needed")
    manager = create_manager(clients, config=manager_config)
    server = ServerThread(create_app(manager), host=host, port=port)
    try:
        server.start(timeout=120)
    except Exception:
        for e in engines:
            e.stop()
        raise
    return Embedded(server, manager, engines)
