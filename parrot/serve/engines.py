"""The engines a manager dispatches to: one handle per engine, with its model and tokenizer.

Owned by the manager. The load counters on a handle are the executor's bookkeeping (what it has
dispatched), not the engine's own numbers, which `EngineClient.stats()` reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from parrot.protocol.errors import ParrotError
from parrot.serve.engine_client import EngineClient, engine_model_folder
from parrot.text import Tokenizer


@dataclass
class EngineHandle:
    engine_id: str
    client: EngineClient
    model: str
    max_model_len: int
    tokenizer: Tokenizer
    num_running_calls: int = 0
    num_early_filled_calls: int = 0  # waiting calls whose prefix sits in this engine's KV


class EnginePool:
    def __init__(self, clients: Sequence[EngineClient], tokenizer_folder: str | Path | None = None) -> None:
        if not clients:
            raise ParrotError("a manager needs at least one engine", field="engines")
        self._clients = list(clients)
        self._tokenizer_folder = None if tokenizer_folder is None else Path(tokenizer_folder)
        self.handles: dict[str, EngineHandle] = {}
        self.default_model = ""

    async def start(self) -> None:
        """Ask each engine for its model and load its tokenizer (one per folder)."""
        tokenizers: dict[Path, Tokenizer] = {}
        for i, client in enumerate(self._clients):
            stats = await client.stats()
            folder = self._tokenizer_folder or await engine_model_folder(client)
            if folder is None:
                raise ParrotError(f"engine {i} does not say where its tokenizer is: pass tokenizer_folder")
            if folder not in tokenizers:
                tokenizers[folder] = Tokenizer(folder)
            engine_id = f"e{i}"
            self.handles[engine_id] = EngineHandle(
                engine_id, client, stats.model, stats.max_model_len, tokenizers[folder]
            )
        self.default_model = next(iter(self.handles.values())).model

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(h.model for h in self.handles.values()))

    def resolve_model(self, model: str | None, field: str = "model") -> str:
        if model is None:
            return self.default_model
        if model not in self.models:
            raise ParrotError(f"unknown model {model!r}; served models: {self.models}", status=404, field=field)
        return model

    def for_model(self, model: str) -> EngineHandle:
        """Any engine of `model`: they share tokenizer and context length."""
        return next(h for h in self.handles.values() if h.model == model)
