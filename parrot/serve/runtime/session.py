"""Sessions: one application run each, owned by one tenant, reached with a bearer token.

The registry owns every live session and the tombstones of deleted or expired ones (so a late
request learns *why* its session is gone). Tokens are stored only as SHA-256 hashes. Mutated only on
the manager's event loop. A session holds its DAG (`graph`) and its calls' run records (`runs`,
created by the executor; call_run.py); both die with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator

from parrot.protocol.errors import ParrotError
from parrot.serve.clock import REAL_CLOCK, Clock
from parrot.serve.config import ManagerConfig
from parrot.serve.runtime.call_run import CallRun, CallState
from parrot.serve.runtime.graph import SessionGraph, StagedBatch
from parrot.serve.runtime.rate import RateLimiter
from parrot.serve.runtime.variable import Variable

_NUM_TOMBSTONES = 10_000
# With no keys configured (development), requests without an `Authorization` header are this tenant's.
ANONYMOUS_TENANT = "tenant-anonymous"


def _key_in(key: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership: every configured key is compared, each in constant time."""
    found = False
    for k in keys:
        found |= hmac.compare_digest(key.encode(), k.encode())
    return found


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Session:
    def __init__(
        self, session_id: str, tenant: str, token_hash: str, idle_timeout_s: float, clock: Clock = REAL_CLOCK
    ) -> None:
        self.clock = clock
        self.session_id = session_id
        self.tenant = tenant
        self.token_hash = token_hash
        self.idle_timeout_s = idle_timeout_s
        self.graph = SessionGraph()  # the calls' and variables' structure
        self.runs: dict[str, CallRun] = {}  # call_id -> the call's run state (call_run.py)
        self.last_active = self.clock.now()
        self.num_waiting_gets = 0  # a waiting get keeps the session alive
        self.submitting = False  # a batch is being tokenized off the event loop (manager.submit_async)
        self.num_chars = 0  # text stored: templates and input values (ManagerConfig.limits.max_chars_per_session)

    @property
    def num_open_calls(self) -> int:
        """Its calls not finished yet (waiting for inputs or an engine, or running)."""
        return sum(r.state is CallState.WAITING or r.state is CallState.RUNNING for r in self.runs.values())

    @property
    def num_tokens_in_flight(self) -> int:
        """Prompt tokens (known at submit) and max output tokens of its unfinished calls."""
        calls = self.graph.calls
        open_ = (CallState.WAITING, CallState.RUNNING)
        return sum(calls[call_id].num_tokens for call_id, r in self.runs.items() if r.state in open_)

    def check_chars(self, num_chars: int, limit: int, field: str) -> None:
        """413 naming `field` if storing `num_chars` more characters of text would pass `limit`."""
        if self.num_chars + num_chars > limit:
            raise ParrotError(
                f"the session would store {self.num_chars + num_chars} characters of text; the limit is {limit}",
                status=413,
                field=field,
            )

    def touch(self) -> None:
        self.last_active = self.clock.now()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A client waits on the session (a get, a stream): it is not idle meanwhile."""
        self.num_waiting_gets += 1
        try:
            yield
        finally:
            self.num_waiting_gets -= 1
            self.touch()

    async def stream(self, var: Variable, timeout_s: float) -> AsyncIterator[str]:
        """The variable's chunks for at most `timeout_s` (then a 408 error, as a get's)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        with self.waiting():
            async with contextlib.aclosing(var.stream()) as chunks:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                    except TimeoutError:
                        msg = f"variable {var.var_id!r} did not finish within {timeout_s:g} s"
                        raise ParrotError(msg, status=408) from None
                    yield chunk

    def idle_s(self, now: float | None = None) -> float:
        return 0.0 if self.num_waiting_gets else (self.clock.now() if now is None else now) - self.last_active


class SessionRegistry:
    def __init__(self, config: ManagerConfig, run_id: str = "", clock: Clock = REAL_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.run_id = run_id  # in every token: an earlier run's token is told its session was lost
        self.sessions: dict[str, Session] = {}
        self._by_tenant: dict[str, set[Session]] = {}  # tenant -> its open sessions (quotas)
        # tenant -> [calls, their tokens] its open sessions hold, finished or not: bounds on its load
        # that cost nothing to read (the quota check counts exactly only near a limit)
        self._committed: dict[str, list[int]] = {}
        self._by_token_hash: dict[str, Session] = {}
        self._tombstones: OrderedDict[str, tuple[str, str]] = OrderedDict()  # token hash -> (session_id, why)
        self.rates = RateLimiter(
            config.limits.max_requests_per_s_per_tenant, config.limits.request_burst_per_tenant, clock.now
        )

    def tenant_of(self, api_key: str | None) -> str:
        """The tenant an API key names; ParrotError(401) if it is missing or not accepted. With no
        keys configured (development) no key is needed: a request without one is ANONYMOUS_TENANT's."""
        config = self.config
        if not api_key:
            if not config.auth.open_access:
                raise ParrotError(
                    "missing API key: send `Authorization: Bearer <key>`", status=401, field="authorization"
                )
            self.rates.charge(ANONYMOUS_TENANT)
            return ANONYMOUS_TENANT
        if not config.auth.open_access and not _key_in(api_key, (*config.auth.api_keys, *config.auth.operator_keys)):
            raise ParrotError("invalid API key", status=401, field="authorization")
        tenant = "tenant-" + _hash(api_key)[:16]
        self.rates.charge(tenant)
        return tenant

    def admit(self, session: Session, staged: StagedBatch) -> None:
        """A checked batch joins `session`: 429 if its tokens pass the tenant's tokens in flight, else
        count its calls and tokens (the tenant's, which only grow until the session is removed) and text."""
        num_tokens = sum(call.num_tokens for call in staged.calls)
        self.check_tenant_load(session.tenant, num_tokens=num_tokens)
        committed = self._committed.setdefault(session.tenant, [0, 0])
        committed[0] += len(staged.calls)
        committed[1] += num_tokens
        session.num_chars += staged.num_chars

    def of_tenant(self, tenant: str) -> set[Session]:
        """The tenant's open sessions."""
        return self._by_tenant.get(tenant, set())

    def is_operator(self, api_key: str | None) -> bool:
        return self.config.auth.open_access or (
            api_key is not None and _key_in(api_key, self.config.auth.operator_keys)
        )

    def require_operator(self, api_key: str | None) -> None:
        """401 without an accepted key, 403 unless it is an operator's (anyone with open access)."""
        self.tenant_of(api_key)
        if not self.is_operator(api_key):
            raise ParrotError(
                "this needs an operator key (ManagerConfig.auth.operator_keys)", status=403, field="authorization"
            )

    def check_tenant_load(self, tenant: str, num_calls: int = 0, num_tokens: int = 0) -> None:
        """429 (retry in 1 s) if `num_calls` more unfinished calls, or `num_tokens` more tokens in
        flight, would pass the tenant's limit."""
        sessions = self.of_tenant(tenant)
        bounds = self._committed.get(tenant, [0, 0])
        checks: list[tuple[str, int, int, int, Callable[[Session], int]]] = [
            (
                "unfinished calls",
                num_calls,
                self.config.limits.max_open_calls_per_tenant,
                bounds[0],
                lambda s: s.num_open_calls,
            ),
            (
                "tokens in flight (prompts and max_tokens of unfinished calls)",
                num_tokens,
                self.config.limits.max_tokens_in_flight_per_tenant,
                bounds[1],
                lambda s: s.num_tokens_in_flight,
            ),
        ]
        for what, num_new, limit, bound, held in checks:
            if num_new and bound + num_new > limit:  # even if none had finished: no exact count needed
                num_held = sum(held(s) for s in sessions)
                if num_held + num_new > limit:
                    raise ParrotError(
                        f"this API key has {num_held} {what}; {num_new} more would pass its limit of {limit}",
                        status=429,
                        field="calls",
                        retry_after_s=1,
                    )

    def visible_to(self, api_key: str | None) -> list[Session]:
        """The sessions a key may see: an operator's, every session; a tenant's, its own."""
        tenant = self.tenant_of(api_key)
        if self.is_operator(api_key):
            return list(self.sessions.values())
        return list(self.of_tenant(tenant))

    def inspect(self, token: str | None, session_id: str) -> Session:
        """For reading a session's status: its own token, or an operator key for any session."""
        if token and not token.startswith("pst-"):
            self.require_operator(token)
            session = self.sessions.get(session_id)
            if session is None:
                raise ParrotError(f"unknown session {session_id!r}", status=404, field="session_id")
            return session
        return self.authenticate(token, session_id)

    def create(self, tenant: str, idle_timeout_s: float | None = None) -> tuple[Session, str]:
        if len(self.sessions) >= self.config.limits.max_sessions:
            raise ParrotError(
                f"too many sessions (limit {self.config.limits.max_sessions})", status=429, retry_after_s=5
            )
        limit = self.config.limits.max_sessions_per_tenant
        if len(self._by_tenant.get(tenant, ())) >= limit:
            raise ParrotError(
                f"this API key has {limit} open sessions, its limit: delete finished ones", status=429, retry_after_s=5
            )
        session_id = f"s-{self.run_id}-{secrets.token_hex(8)}"  # its contexts' ids start with it
        token = f"pst-{self.run_id}.{secrets.token_urlsafe(32)}"
        session = Session(
            session_id, tenant, _hash(token), idle_timeout_s or self.config.limits.session_idle_timeout_s, self.clock
        )
        self.sessions[session_id] = session
        self._by_tenant.setdefault(tenant, set()).add(session)
        self._by_token_hash[session.token_hash] = session
        return session, token

    def authenticate(self, token: str | None, session_id: str) -> Session:
        """The session `session_id` if `token` is its token: 401 no/invalid token, 403 another
        session's token, 404 unknown session, 410 a deleted or expired session. With no keys
        configured, a session opened without a key is reached without a token too (by its id)."""
        if not token:
            return self._tokenless(session_id)
        token_hash = _hash(token)
        session = self._by_token_hash.get(token_hash)
        if session is None:
            gone = self._tombstones.get(token_hash)
            if gone is not None:
                raise ParrotError(f"session {gone[0]!r} was {gone[1]}", status=410, field="session_id")
            run_id = token.removeprefix("pst-").partition(".")[0] if token.startswith("pst-") else None
            if run_id is not None and run_id != self.run_id and "." in token:
                raise ParrotError(
                    f"session {session_id!r} was lost: the manager restarted since it was created "
                    "(sessions are not persisted); start a new session",
                    status=410,
                    field="session_id",
                )
            raise ParrotError("invalid session token", status=401, field="authorization")
        if session.session_id != session_id:
            if session_id in self.sessions:
                raise ParrotError("this token belongs to another session", status=403, field="session_id")
            raise ParrotError(f"unknown session {session_id!r}", status=404, field="session_id")
        self.rates.charge(session.tenant)
        session.touch()
        return session

    def _tokenless(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if not self.config.auth.open_access or (session is not None and session.tenant != ANONYMOUS_TENANT):
            raise ParrotError(
                "missing session token: send `Authorization: Bearer <token>`", status=401, field="authorization"
            )
        if session is None:
            raise ParrotError(f"unknown session {session_id!r}", status=404, field="session_id")
        self.rates.charge(session.tenant)
        session.touch()
        return session

    def remove(self, session_id: str, why: str) -> Session | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._by_tenant[session.tenant].discard(session)
            committed = self._committed.get(session.tenant, [0, 0])
            committed[0] -= len(session.runs)
            committed[1] -= sum(call.num_tokens for call in session.graph.calls.values())
            del self._by_token_hash[session.token_hash]
            self._tombstones[session.token_hash] = (session_id, why)
            while len(self._tombstones) > _NUM_TOMBSTONES:
                self._tombstones.popitem(last=False)
        return session

    def expired(self, now: float | None = None) -> list[Session]:
        now = self.clock.now() if now is None else now
        return [s for s in self.sessions.values() if s.idle_s(now) > s.idle_timeout_s]
