"""`parrot serve`'s own settings (the config file's `[serve]` table): where it listens and which
engines it serves with. The engines' and the manager's settings are `EngineConfig` and `ManagerConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from parrot.protocol.config_fields import check_bounds, setting


@dataclass(frozen=True)
class ServeConfig:
    """Where the manager listens and which engines it serves with: its builtin engine (the `[engine]`
    settings), engines started elsewhere, and OpenAI-compatible servers (vLLM) through the adapter."""

    host: str = setting("127.0.0.1", "address to listen on (without API keys: a loopback address only)")
    port: int = setting(8000, "port to listen on (0: any free port)", ge=0)
    builtin: bool = setting(True, "run a builtin engine in this process (the [engine] settings)")
    engine_urls: tuple[str, ...] = setting((), "engines started elsewhere (`parrot engine`), by URL")
    openai_engines: tuple[str, ...] = setting((), "OpenAI-compatible servers (vLLM) to serve with, by URL")
    openai_model: str | None = setting(None, "the upstream's model (none: its first)")
    openai_tokenizer: str | None = setting(
        None, "a tokenizer folder, or a model name this machine resolves (none: the upstream model card's root)"
    )
    openai_api_key: str | None = setting(None, "the upstream's API key")
    openai_stream_interval: int = setting(
        1, "tokens per streamed chunk asked of the upstream for a streamed generation", ge=1
    )

    def __post_init__(self) -> None:
        check_bounds(self)
