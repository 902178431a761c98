"""The manager's configuration: names and numbers in sections by concern, each field documented as
data (`setting`), validated once.

A config file writes a section as a table (`[manager.scheduling]`); a flag is a field's own name
(`--tpot-target-ms`). The operator guide's configuration reference is generated from these fields
(`python -m parrot.cli.reference`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from parrot.protocol.config_fields import SettingError, check_bounds, setting
from parrot.protocol.objective import Objective


@dataclass(frozen=True)
class AuthConfig:
    """Who may do what. With no key at all (development) any non-empty key is accepted and names its
    own tenant, like vLLM without --api-key; with tenant keys and no operator key, nobody may register
    engines (they come from the command line only)."""

    SECTION: ClassVar[str] = "auth"
    api_keys: tuple[str, ...] = setting((), "tenant keys: may open sessions and send OpenAI requests")
    operator_keys: tuple[str, ...] = setting(
        (), "operator keys: tenants that may also register and remove engines and read the operator routes"
    )
    engine_url_allowlist: tuple[str, ...] = setting(
        (), 'URL prefixes an operator may register engines under, e.g. "http://10.0.0." (empty: any http(s) URL)'
    )

    def __post_init__(self) -> None:
        for name in ("api_keys", "operator_keys"):
            if any(not k for k in getattr(self, name)):
                raise SettingError(f"auth.{name} must be non-empty strings", field=f"auth.{name}")

    @property
    def open_access(self) -> bool:
        """No key configured: any key is accepted (a development setting; loopback only)."""
        return not self.api_keys and not self.operator_keys


@dataclass(frozen=True)
class LimitsConfig:
    """Quotas per tenant (API key) and sizes per session and request. Past a per-tenant quota a request
    gets 429 with Retry-After; past a size, 413 naming the field. The scheduling policy also shares
    each engine between the tenants that have work, so one tenant's flood delays only it."""

    SECTION: ClassVar[str] = "limits"
    max_sessions: int = setting(10_000, "open sessions, all tenants together", gt=0)
    max_sessions_per_tenant: int = setting(1_000, "open sessions of one tenant", gt=0)
    max_open_calls_per_tenant: int = setting(
        10_000, "calls of one tenant not finished yet (waiting or running), across its sessions", gt=0
    )
    max_tokens_in_flight_per_tenant: int = setting(
        4_000_000, "prompt tokens (known at submit) plus max output tokens of one tenant's unfinished calls", gt=0
    )
    max_requests_per_s_per_tenant: float = setting(
        500.0, "requests per second of one tenant on average (a token bucket's refill rate)", gt=0
    )
    request_burst_per_tenant: int = setting(1_000, "requests of one tenant at once (the token bucket's size)", gt=0)
    max_chars_per_session: int = setting(
        64_000_000, "text a session stores (templates and input values), in characters", gt=0
    )
    max_variables_per_session: int = setting(100_000, "Semantic Variables a session holds", gt=0)
    max_calls_per_session: int = setting(50_000, "calls a session holds", gt=0)
    max_body_bytes: int = setting(16 * 1024 * 1024, "size of a request body, in bytes", gt=0)
    session_idle_timeout_s: float = setting(
        600.0, "a session without requests (and no waiting get) this long is deleted", gt=0
    )
    call_deadline_s: float = setting(
        3600.0,
        "a call's run (from its dispatch) may take this long; then it fails with 504 and its engine work stops",
        gt=0,
    )

    def __post_init__(self) -> None:
        check_bounds(self, "limits.")


@dataclass(frozen=True)
class SchedulingConfig:
    """Placing ready calls on engines. The app-centric policy caps each latency-hosting engine at as
    many calls as keep its time per output token under `tpot_target_ms`, calibrated from the engine's
    step profile; the effective target is at least `tpot_floor_slack` times the engine's own one-token
    step (on a 2-core CPU a one-token step of the 135M model takes ~80 ms, above the 50 ms a GPU
    deployment would aim at), so a target below what the hardware can do does not serialize latency
    work."""

    SECTION: ClassVar[str] = "scheduling"
    policy: str = setting("app_centric", "scheduling policy, a name in parrot.serve.policy.registry.POLICIES")
    max_running_calls_per_engine: int = setting(
        64, "calls running on one engine at once (an engine's registration may override it)", gt=0
    )
    early_fill: bool = setting(True, "fill a waiting call's ready prompt prefix before its missing inputs arrive")
    max_early_filled_calls_per_engine: int = setting(256, "waiting calls one engine holds early-filled", ge=0)
    objective_deduction: bool = setting(
        True, "deduce each call's objective from the gets downstream of it (off: every call gets default_objective)"
    )
    default_objective: Objective = setting(Objective.LATENCY, "the objective of a call no get asks for")
    tpot_target_ms: float = setting(50.0, "time per output token, in ms, latency-critical work should stay under", gt=0)
    tpot_floor_slack: float = setting(
        2.0, "the effective tpot target is at least this times the engine's own one-token step time", gt=0
    )
    latency_cap_calls: int | None = setting(
        None, "a fixed cap of calls on a latency-hosting engine (none: calibrated from tpot_target_ms)", ge=1
    )
    initial_latency_cap_calls: int = setting(16, "the latency cap until an engine's step profile exists", gt=0)
    aging_s: float = setting(2.0, "ready calls waiting this long go first", ge=0)

    def __post_init__(self) -> None:
        check_bounds(self, "scheduling.")


@dataclass(frozen=True)
class SharingConfig:
    """Prefix sharing: calls fork from cached prefix contexts hashed at Semantic Variable boundaries
    (plain requests: chat messages and fixed token blocks). Idle cached prefixes are evicted, leaves
    first and least recently used first, when an engine's free KV blocks fall below a fraction."""

    SECTION: ClassVar[str] = "sharing"
    prefix_sharing: bool = setting(True, "fork calls from cached prefix contexts")
    min_prefix_tokens: int = setting(32, "prefixes shorter than this many tokens are not cached", gt=0)
    prefix_block_tokens: int = setting(64, "plain requests get a prefix point every this many tokens", gt=0)
    prefix_evict_below_free: float = setting(
        0.1, "evict idle cached prefixes when an engine's free KV blocks fall below this fraction (0 to 1)"
    )
    prefix_evict_to_free: float = setting(
        0.2, "... until this fraction of its KV blocks is free again (prefix_evict_below_free to 1)"
    )

    def __post_init__(self) -> None:
        check_bounds(self, "sharing.")
        if not 0 <= self.prefix_evict_below_free <= self.prefix_evict_to_free <= 1:
            raise SettingError(
                "need 0 <= sharing.prefix_evict_below_free <= sharing.prefix_evict_to_free <= 1",
                field="sharing.prefix_evict_below_free",
            )


@dataclass(frozen=True)
class EnginesConfig:
    """Many engines: health polling, failover, and the lease on this run's contexts. A dead engine's
    calls are re-dispatched to the live ones."""

    SECTION: ClassVar[str] = "engines"
    heartbeat_interval_s: float = setting(0.5, "every engine's stats are polled this often", gt=0)
    heartbeat_timeout_s: float = setting(2.0, "a heartbeat answer is due within this long", gt=0)
    engine_dead_after_s: float = setting(3.0, "an engine silent this long is dead", gt=0)
    max_call_attempts: int = setting(3, "runs of one call (its first and its re-dispatches) before it fails", gt=0)
    context_lease_s: float = setting(
        60.0, "engines free this run's contexts once the manager is gone this long (renewed every quarter)", gt=0
    )

    def __post_init__(self) -> None:
        check_bounds(self, "engines.")


@dataclass(frozen=True)
class LifecycleConfig:
    """The manager's own housekeeping: session expiry and shutdown (SIGTERM/SIGINT: new work gets 503
    while calls in flight may finish; then every session closes, pending gets and streams end with a
    410 error, and contexts are freed)."""

    SECTION: ClassVar[str] = "lifecycle"
    expiry_interval_s: float = setting(5.0, "idle sessions are looked for this often", gt=0)
    shutdown_grace_s: float = setting(30.0, "at shutdown, calls in flight may finish for this long", gt=0)

    def __post_init__(self) -> None:
        check_bounds(self, "lifecycle.")


@dataclass(frozen=True)
class ManagerConfig:
    """Every manager setting, by section. Build one with its sections
    (`ManagerConfig(sharing=SharingConfig(prefix_sharing=False))`) or change settings by path
    (`config.replace({"scheduling.tpot_target_ms": 80})`)."""

    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)

    def replace(self, changes: Mapping[str, Any]) -> ManagerConfig:
        """A copy with `changes` applied, each keyed by its path (`"sharing.prefix_sharing"`)."""
        by_section: dict[str, dict[str, Any]] = {}
        for path, value in changes.items():
            name, _, leaf = path.partition(".")
            if name not in SECTIONS or leaf not in {f.name for f in dataclasses.fields(SECTIONS[name])}:
                raise SettingError(f"{path} is not a manager setting", field=path)
            by_section.setdefault(name, {})[leaf] = value
        updated = {name: dataclasses.replace(getattr(self, name), **leaves) for name, leaves in by_section.items()}
        return dataclasses.replace(self, **updated)


# Section name (its ManagerConfig field and its config-file table `[manager.NAME]`) -> its class.
SECTIONS: dict[str, type] = {
    cls.SECTION: cls
    for cls in (AuthConfig, LimitsConfig, SchedulingConfig, SharingConfig, EnginesConfig, LifecycleConfig)
}
