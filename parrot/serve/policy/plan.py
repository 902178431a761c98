"""Scheduling's vocabulary: the snapshot a policy reads and the plan it returns.

The executor builds the `Snapshot`, asks the configured policy for a `Plan`, and applies it; the
policy never touches a session or an engine, so it is tested on hand-built snapshots.

A plan says, for calls that are not yet dispatched:
- `FailCall`: an input failed, so the call fails without running;
- `Dispatch`: all inputs are set; run the call on this engine;
- `EarlyFill`: inputs are missing, but the first `num_pieces` pieces are known; fill them now so the
  prompt is mostly prefilled when the producer finishes (pipelining).

Policies are strategies (`Policy`), by name in registry.py: `fifo` (fifo.py: submission order,
least-loaded engine) and `app_centric` (app_centric.py: objectives, task groups, prefix affinity,
calibrated capacity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from parrot.protocol.objective import Objective

CallKey = tuple[str, str]  # (session_id, call_id)


@dataclass(frozen=True, slots=True)
class CallView:
    key: CallKey
    model: str
    order: int  # global submission order; a producer is always submitted before its consumers
    inputs_ready: bool
    failed_var_id: str | None  # an input that failed
    num_ready_pieces: int  # leading pieces with known tokens (before the first output)
    num_filled_pieces: int  # leading pieces already filled (or being filled) on `engine_id`
    engine_id: str | None  # set once the call has early work on an engine (affinity)
    # Read by the app-centric policy (objectives.py, prefix_cache.py); FIFO ignores them.
    objective: Objective = Objective.LATENCY
    priority: int = 0
    task_group: str | None = None  # unique across sessions
    pinned: bool = False  # its own context exists on `engine_id`: it must run there
    prefix_hits: tuple[tuple[str, int], ...] = ()  # (engine_id, tokens of its longest prefix cached there)
    # Tokens of its prompt that every engine of its model holds; those engines are in prefix_hits
    # only where they hold more (a system prompt cached everywhere is no reason to prefer one).
    prefix_floor: int = 0
    ready_since: float = 0.0  # monotonic time it became ready to run (aging)
    tenant: str = ""  # its session's tenant (fair share)

    @property
    def actionable(self) -> bool:
        """A policy can do something with it: fail it, dispatch it, or fill its ready pieces early
        (what a snapshot lists)."""
        return self.failed_var_id is not None or self.inputs_ready or self.num_ready_pieces > self.num_filled_pieces


@dataclass(frozen=True, slots=True)
class EngineView:
    engine_id: str
    model: str
    num_running_calls: int
    max_running_calls: int
    num_early_filled_calls: int
    max_early_filled_calls: int
    alive: bool = True
    num_latency_calls: int = 0  # running latency-critical calls
    latency_cap: int = 1 << 30  # calibrated: most calls while it hosts latency work (capacity.py)


@dataclass(frozen=True)
class Snapshot:
    # The waiting calls a policy can act on (`CallView.actionable`), in submission order; calls that
    # wait on producers with nothing to fill early are left out.
    calls: tuple[CallView, ...]
    engines: tuple[EngineView, ...]
    early_fill: bool = True
    now: float = 0.0  # monotonic time of the snapshot (aging)
    aging_s: float = 0.0  # waiting this long puts a call first (app-centric)
    group_engines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # task group -> engines running it
    app_engines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # session -> engines running it
    # engine -> tenant -> its calls running there (fair share between tenants)
    tenant_running: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FailCall:
    key: CallKey
    var_id: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    key: CallKey
    engine_id: str
    # Several tenants have work and the call's tenant runs less than its share of this engine:
    # the engine ranks the call above those of tenants over their share (call_run.engine_priority).
    fair_share: bool = False


@dataclass(frozen=True, slots=True)
class EarlyFill:
    key: CallKey
    engine_id: str
    num_pieces: int  # fill the leading pieces up to here


@dataclass(frozen=True)
class Plan:
    fail: tuple[FailCall, ...] = ()
    early_fill: tuple[EarlyFill, ...] = ()
    dispatch: tuple[Dispatch, ...] = ()
    blocked: tuple[CallKey, ...] = field(default=())  # ready, but no engine had capacity


class Policy(Protocol):
    def plan(self, snapshot: Snapshot) -> Plan:
        """Decide for the snapshot's calls; pure: same snapshot, same plan."""
        ...
