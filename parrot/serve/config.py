"""The manager's configuration: names and numbers, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from parrot.protocol.errors import ParrotError


@dataclass(frozen=True)
class ManagerConfig:
    # Tenants: API keys accepted by POST /v1/sessions and the OpenAI routes. Empty: any non-empty
    # key is accepted and names its own tenant (a development setting, like vLLM without --api-key).
    api_keys: tuple[str, ...] = ()
    session_idle_timeout_s: float = 600.0
    expiry_interval_s: float = 5.0
    max_sessions: int = 10_000
    max_variables_per_session: int = 100_000
    max_calls_per_session: int = 50_000
    max_body_bytes: int = 16 * 1024 * 1024
    # Scheduling policy (a name in parrot.serve.scheduler.POLICIES) and its capacities.
    policy: str = "fifo"
    max_running_calls_per_engine: int = 64
    # Pipelining: fill a waiting call's ready prompt prefix before its missing inputs arrive.
    early_fill: bool = True
    max_early_filled_calls_per_engine: int = 256
    # A context is freed once the engine has finished the work queued on it (a generation whose
    # reader went away runs to its end); the free is retried with backoff for this long.
    free_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in (
            "session_idle_timeout_s",
            "expiry_interval_s",
            "max_sessions",
            "max_variables_per_session",
            "max_calls_per_session",
            "max_body_bytes",
            "max_running_calls_per_engine",
            "free_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ParrotError(f"{name} must be > 0", field=name)
        if self.max_early_filled_calls_per_engine < 0:
            raise ParrotError(
                "max_early_filled_calls_per_engine must be >= 0", field="max_early_filled_calls_per_engine"
            )
        if any(not k for k in self.api_keys):
            raise ParrotError("api keys must be non-empty", field="api_keys")
