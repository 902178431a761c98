"""The manager's configuration: names and numbers, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective


@dataclass(frozen=True)
class ManagerConfig:
    # Tenants: API keys accepted by POST /v1/sessions and the OpenAI routes. Empty: any non-empty
    # key is accepted and names its own tenant (a development setting, like vLLM without --api-key).
    api_keys: tuple[str, ...] = ()
    # Operators: keys that may also register and remove engines (POST/DELETE /v1/engines); they
    # are tenants too. With no keys at all (development) any key may; with tenant keys and no
    # operator keys, nobody may (engines come from the command line only).
    operator_keys: tuple[str, ...] = ()
    # Engine URLs an operator may register: prefixes such as "http://10.0.0." (empty: any http(s) URL).
    engine_url_allowlist: tuple[str, ...] = ()
    session_idle_timeout_s: float = 600.0
    expiry_interval_s: float = 5.0
    max_sessions: int = 10_000
    # Per tenant (API key): open sessions, and calls not finished yet (waiting or running) across
    # its sessions; over them a request gets 429 with Retry-After. The policy also shares each
    # engine between the tenants that have work (app_centric), so one tenant's flood delays only it.
    max_sessions_per_tenant: int = 1_000
    max_open_calls_per_tenant: int = 10_000
    # ... and prompt tokens (known at submit) plus max output tokens of those calls.
    max_tokens_in_flight_per_tenant: int = 4_000_000
    # Requests per second per tenant (a token bucket: `max_requests_per_s_per_tenant` on average,
    # `request_burst_per_tenant` at once); over it, 429 with Retry-After.
    max_requests_per_s_per_tenant: float = 500.0
    request_burst_per_tenant: int = 1_000
    # Text a session stores (templates and input values), in characters; past it 413.
    max_chars_per_session: int = 64_000_000
    max_variables_per_session: int = 100_000
    max_calls_per_session: int = 50_000
    max_body_bytes: int = 16 * 1024 * 1024
    # Scheduling policy (a name in parrot.serve.policy.registry.POLICIES) and its capacities.
    policy: str = "app_centric"
    max_running_calls_per_engine: int = 64
    # Pipelining: fill a waiting call's ready prompt prefix before its missing inputs arrive.
    early_fill: bool = True
    max_early_filled_calls_per_engine: int = 256
    # Shutdown (SIGTERM/SIGINT): new work gets 503 while in-flight calls may finish for this long;
    # then every session closes (pending gets and streams end with a 410 error) and contexts free.
    shutdown_grace_s: float = 30.0
    # A call's run (fills and generations, from its dispatch) may take this long; then it fails
    # with 504 and its engine work stops (a chat without max_tokens, a stuck engine).
    call_deadline_s: float = 3600.0

    # --- the paper's optimizations; each can be switched off (benchmarks measure them alone) ---
    # Prefix sharing (prefix.py, prefix_cache.py, contexts.py): calls fork from cached prefix
    # contexts hashed at Semantic Variable boundaries (plain requests: chat messages and fixed
    # token blocks of `prefix_block_tokens`); prefixes shorter than `min_prefix_tokens` are not
    # cached. Idle cached prefixes are evicted when an engine's free KV blocks fall below
    # `prefix_evict_below_free` (a fraction), until `prefix_evict_to_free` is free again.
    prefix_sharing: bool = True
    min_prefix_tokens: int = 32
    prefix_block_tokens: int = 64
    prefix_evict_below_free: float = 0.1
    prefix_evict_to_free: float = 0.2
    # Objective deduction (policy/objectives.py): off, every call gets `default_objective`.
    objective_deduction: bool = True
    default_objective: Objective = Objective.LATENCY
    # App-centric policy ("app_centric"): a latency-critical engine runs at most as many calls as
    # batched tokens keep its time per output token under `tpot_target_ms`, calibrated from the
    # engine's step profile (`latency_cap_calls` fixes it instead; `initial_latency_cap_calls`
    # until a profile exists). Ready calls waiting `aging_s` go first. A target below what the
    # hardware can do would serialize latency work, so the effective target is at least
    # `tpot_floor_slack` times the engine's own one-token step time (on a 2-core CPU a one-token
    # step of the 135M model takes ~80 ms, above the 50 ms a GPU deployment would aim at).
    tpot_target_ms: float = 50.0
    tpot_floor_slack: float = 2.0
    latency_cap_calls: int | None = None
    initial_latency_cap_calls: int = 16
    aging_s: float = 2.0

    # --- many engines (health.py) ---
    # Engines are polled every `heartbeat_interval_s`; one silent for `engine_dead_after_s` is
    # dead: its calls are re-dispatched (at most `max_call_attempts` runs per call).
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 2.0
    engine_dead_after_s: float = 3.0
    max_call_attempts: int = 3
    # Engines hold this run's contexts on a lease the heartbeat renews every quarter of it; once the
    # manager is gone for this long, an engine frees them (engine_api.LeaseRequest).
    context_lease_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "session_idle_timeout_s",
            "expiry_interval_s",
            "max_sessions",
            "max_sessions_per_tenant",
            "max_open_calls_per_tenant",
            "max_tokens_in_flight_per_tenant",
            "max_requests_per_s_per_tenant",
            "request_burst_per_tenant",
            "max_chars_per_session",
            "max_variables_per_session",
            "max_calls_per_session",
            "max_body_bytes",
            "max_running_calls_per_engine",
            "shutdown_grace_s",
            "call_deadline_s",
            "min_prefix_tokens",
            "prefix_block_tokens",
            "tpot_target_ms",
            "tpot_floor_slack",
            "initial_latency_cap_calls",
            "heartbeat_interval_s",
            "heartbeat_timeout_s",
            "engine_dead_after_s",
            "max_call_attempts",
            "context_lease_s",
        ):
            if getattr(self, name) <= 0:
                raise ParrotError(f"{name} must be > 0", field=name)
        if self.max_early_filled_calls_per_engine < 0:
            raise ParrotError(
                "max_early_filled_calls_per_engine must be >= 0", field="max_early_filled_calls_per_engine"
            )
        if self.latency_cap_calls is not None and self.latency_cap_calls < 1:
            raise ParrotError("latency_cap_calls must be >= 1 (or None: calibrated)", field="latency_cap_calls")
        if self.aging_s < 0:
            raise ParrotError("aging_s must be >= 0", field="aging_s")
        if not 0 <= self.prefix_evict_below_free <= self.prefix_evict_to_free <= 1:
            raise ParrotError(
                "need 0 <= prefix_evict_below_free <= prefix_evict_to_free <= 1", field="prefix_evict_below_free"
            )
        for name in ("api_keys", "operator_keys"):
            if any(not k for k in getattr(self, name)):
                raise ParrotError(f"{name} must be non-empty strings", field=name)

    @property
    def open_access(self) -> bool:
        """No key configured: any key is accepted (a development setting; loopback only)."""
        return not self.api_keys and not self.operator_keys
