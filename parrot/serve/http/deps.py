"""FastAPI dependencies of the manager's routes: the manager behind the app, the caller's session.

Coroutines, not plain functions: FastAPI runs a plain-function dependency in its thread pool (a
thread hop per dependency per request, and the manager's state read off its event loop)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from parrot.serve.manager import Manager
from parrot.serve.runtime.session import Session
from parrot.web.edge import BearerToken


async def get_manager(request: Request) -> Manager:
    manager = request.app.state.manager
    assert isinstance(manager, Manager)
    return manager


ManagerDep = Annotated[Manager, Depends(get_manager)]


async def get_session(session_id: str, token: BearerToken, manager: ManagerDep) -> Session:
    return manager.session(session_id, token)


SessionDep = Annotated[Session, Depends(get_session)]


async def get_inspected_session(session_id: str, token: BearerToken, manager: ManagerDep) -> Session:
    return manager.sessions.inspect(token, session_id)


InspectedSessionDep = Annotated[Session, Depends(get_inspected_session)]
