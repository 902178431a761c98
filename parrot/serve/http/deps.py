"""FastAPI dependencies of the manager's routes: the manager behind the app, the caller's session."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from parrot.serve.manager import Manager
from parrot.serve.runtime.session import Session
from parrot.web.edge import BearerToken


def get_manager(request: Request) -> Manager:
    manager = request.app.state.manager
    assert isinstance(manager, Manager)
    return manager


ManagerDep = Annotated[Manager, Depends(get_manager)]


def get_session(session_id: str, token: BearerToken, manager: ManagerDep) -> Session:
    return manager.session(session_id, token)


SessionDep = Annotated[Session, Depends(get_session)]


def get_inspected_session(session_id: str, token: BearerToken, manager: ManagerDep) -> Session:
    return manager.sessions.inspect(token, session_id)


InspectedSessionDep = Annotated[Session, Depends(get_inspected_session)]
