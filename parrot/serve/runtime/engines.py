"""The engines a manager dispatches to: one handle per engine, with its model and tokenizer.

Owned by the manager. The load counters on a handle are the executor's bookkeeping (what it has
dispatched), not the engine's own numbers, which `EngineClient.stats()` reports; `stats`, `alive`,
`last_heartbeat` and `latency_cap` are the health monitor's (health.py). Engines may be added while
serving; a dead engine keeps its handle (for status) and is never scheduled again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from parrot.protocol.engine_api import EngineStats
from parrot.protocol.engine_client import EngineClient, engine_model_folder
from parrot.protocol.errors import ParrotError
from parrot.serve.clock import REAL_CLOCK, Clock
from parrot.text import Tokenizer


@dataclass
class EngineHandle:
    engine_id: str
    client: EngineClient
    model: str
    max_model_len: int
    tokenizer: Tokenizer
    stats: EngineStats  # the latest heartbeat's (health.py)
    num_running_calls: int = 0
    num_latency_calls: int = 0  # running calls deduced latency-critical
    num_early_filled_calls: int = 0  # waiting calls whose prefix sits in this engine's KV
    max_running_calls: int | None = None  # given at registration; else the manager's limit
    alive: bool = True  # False once the health monitor declared it dead (never revived)
    suspected: bool = False  # a call could not reach it: no new work until it answers a heartbeat
    last_heartbeat: float = 0.0  # the pool's clock at registration, then at each answered heartbeat
    latency_cap: int = 1 << 30  # calibrated by the health monitor (capacity.py)
    url: str | None = None


class EnginePool:
    def __init__(
        self, clients: Sequence[EngineClient], tokenizer_folder: str | Path | None = None, clock: Clock = REAL_CLOCK
    ) -> None:
        self.clock = clock
        if not clients:
            raise ParrotError("a manager needs at least one engine", field="engines")
        self._clients = list(clients)
        self._tokenizer_folder = None if tokenizer_folder is None else Path(tokenizer_folder)
        self.handles: dict[str, EngineHandle] = {}
        self.default_model = ""
        self._tokenizers: dict[Path, Tokenizer] = {}
        self._num_added = 0

    async def start(self) -> None:
        """Ask each engine for its model and load its tokenizer (one per folder)."""
        for client in self._clients:
            await self.add(client)

    async def add(
        self, client: EngineClient, max_running_calls: int | None = None, url: str | None = None
    ) -> EngineHandle:
        """Register an engine (also while serving): its model, context length and tokenizer."""
        stats = await client.stats()
        folder = self._tokenizer_folder or await engine_model_folder(client)
        if folder is None:
            raise ParrotError(
                "the engine does not say where its tokenizer is: give the manager a tokenizer_folder "
                "(an OpenAI-compatible upstream: give its adapter a tokenizer folder)",
                field="url",
            )
        if folder not in self._tokenizers:
            self._tokenizers[folder] = Tokenizer(folder)
        engine_id = f"e{self._num_added}"
        self._num_added += 1
        handle = EngineHandle(
            engine_id,
            client,
            stats.model,
            stats.max_model_len,
            self._tokenizers[folder],
            stats,
            max_running_calls=max_running_calls,
            last_heartbeat=self.clock.now(),
            url=url,
        )
        self.handles[engine_id] = handle
        if not self.default_model:
            self.default_model = handle.model
        return handle

    async def close_clients(self, handles: Sequence[EngineHandle] | None = None) -> None:
        """Close these engines' clients (all: when the manager stops; it owns the clients it was
        given). A client without `aclose` (an in-process engine) has nothing to close."""
        for handle in self.handles.values() if handles is None else handles:
            if (aclose := getattr(handle.client, "aclose", None)) is not None:
                await aclose()

    @property
    def tokenizer_folder(self) -> Path | None:
        """The one tokenizer folder given for every engine, if any (else each engine says its own)."""
        return self._tokenizer_folder

    @property
    def alive(self) -> list[EngineHandle]:
        return [h for h in self.handles.values() if h.alive]

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(h.model for h in self.alive))

    def resolve_model(self, model: str | None, field: str = "model") -> str:
        """The model a request names (None: the default); 404 for a model no engine serves, 503
        while every engine of it is dead (no request is accepted that nothing could run)."""
        name = self.default_model if model is None else model
        if name in self.models:
            return name
        if not self.alive:
            raise ParrotError("no live engine: every engine is dead or removed (see GET /ready)", status=503)
        if any(h.model == name for h in self.handles.values()):
            raise ParrotError(f"no live engine serves model {name!r} (see GET /ready)", status=503, field=field)
        raise ParrotError(f"unknown model {name!r}; served models: {self.models}", status=404, field=field)

    def for_model(self, model: str) -> EngineHandle:
        """An engine of `model` (the first live one, else the first): they share tokenizer and
        context length. Asked once per changed call at every step: it stops at the first live one."""
        first = None
        for h in self.handles.values():
            if h.model == model:
                if h.alive:
                    return h
                first = first or h
        if first is None:
            raise KeyError(f"no engine serves model {model!r}")
        return first
