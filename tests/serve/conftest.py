"""Fixtures of the manager's tests: a tiny engine, a live manager over it, the SDK's requests."""

from __future__ import annotations

from typing import Any

import pytest
from live_server import server, tiny_engine  # noqa: F401  (fixtures)

from parrot.frontend.transport import ApiTransport


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'METHOD path' of every request the SDK's transport sends (query strings left out)."""
    sent: list[str] = []
    request = ApiTransport._request

    async def recording(self: ApiTransport, method: str, path: str, stream: bool = False, **kw: Any) -> Any:
        sent.append(f"{method} {path.replace(self.session_id, '{id}') if self.session_id else path}")
        return await request(self, method, path, stream, **kw)

    monkeypatch.setattr(ApiTransport, "_request", recording)
    return sent
