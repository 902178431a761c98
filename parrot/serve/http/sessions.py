"""The public Semantic Variable API: sessions, semantic calls, variables (FastAPI routes).

Thin: each route authenticates, then calls one Manager method; the models are those of
parrot.protocol.public_api, so the OpenAPI schema is the protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import StreamingResponse

from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import (
    MAX_GET_TIMEOUT_S,
    CallInfo,
    CallSpec,
    CreateSessionRequest,
    ErrorBody,
    ErrorResponse,
    RunRequest,
    RunResult,
    SessionCreated,
    SessionList,
    SessionStatus,
    SetVariableRequest,
    StreamChunk,
    SubmitRequest,
    SubmitResponse,
    VariableInfo,
    VariableList,
    VariableSpec,
    VariableValue,
)
from parrot.serve.http.deps import InspectedSessionDep, ManagerDep, SessionDep
from parrot.serve.runs import run_once
from parrot.serve.runtime.status import session_summary
from parrot.web.edge import BearerToken, unless_disconnected

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 410, 413)
}
router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=_ERRORS)
runs_router = APIRouter(tags=["sessions"], responses=_ERRORS | {408: {"model": ErrorResponse}})


@runs_router.post("/v1/run", response_model=RunResult)
async def run(request: Request, api_key: BearerToken, manager: ManagerDep, req: RunRequest) -> RunResult:
    """A batch run to its end in a session of its own, in one request: the answer carries the
    outputs' values and the session is gone (an output's error is the answer; 408 after timeout_s,
    its calls cancelled; a client that disconnects cancels the run)."""
    return await unless_disconnected(request, run_once(manager, api_key, req))


@router.post("", status_code=201, response_model=SessionCreated)
async def create_session(
    api_key: BearerToken,
    manager: ManagerDep,
    req: Annotated[CreateSessionRequest | None, Body()] = None,
) -> SessionCreated:
    """Open a session with the tenant's API key; the answer's token authorizes the session's calls.
    With `submit`, its first batch goes with it (all or nothing: a refused batch leaves no session)."""
    return await manager.open_session(api_key, req or CreateSessionRequest())


@router.delete("/{session_id}", status_code=204)
async def delete_session(session: SessionDep, manager: ManagerDep) -> Response:
    """Cancel the session's calls, free their engine contexts, fail its waiting gets (410)."""
    await manager.delete_session(session)
    return Response(status_code=204)


@router.get("", response_model=SessionList)
async def list_sessions(api_key: BearerToken, manager: ManagerDep) -> SessionList:
    """The sessions the key may see: an operator key, every tenant's; a tenant key, its own."""
    return SessionList(sessions=[session_summary(s) for s in manager.sessions.visible_to(api_key)])


@router.get("/{session_id}", response_model=SessionStatus)
async def session_status(session: InspectedSessionDep, manager: ManagerDep) -> SessionStatus:
    """The session's status, with its token (or, for any session, an operator key)."""
    return manager.status(session)


@router.post("/{session_id}/submit", response_model=SubmitResponse)
async def submit(req: SubmitRequest, session: SessionDep, manager: ManagerDep) -> SubmitResponse:
    """Create variables and submit semantic calls in one batch (all or nothing); returns at once."""
    return await manager.submit_async(session, req)


@router.post("/{session_id}/calls", response_model=CallInfo)
async def submit_call(spec: CallSpec, session: SessionDep, manager: ManagerDep) -> CallInfo:
    """Submit one semantic call; returns its output variable ids at once."""
    return manager.submit_call(session, spec)


@router.delete("/{session_id}/calls/{call_id}", status_code=204)
async def cancel_call(call_id: str, session: SessionDep, manager: ManagerDep) -> Response:
    """Cancel an unfinished call: its outputs fail with 410 (their consumers with 424), its engine
    work stops and its context is freed. 409 if it has finished."""
    manager.cancel_call(session, call_id)
    return Response(status_code=204)


@router.post("/{session_id}/variables", status_code=201, response_model=VariableInfo)
async def create_variable(spec: VariableSpec, session: SessionDep, manager: ManagerDep) -> VariableInfo:
    return manager.create_variable(session, spec)


@router.get("/{session_id}/variables", response_model=VariableList)
async def list_variables(session: SessionDep, manager: ManagerDep) -> VariableList:
    return manager.list_variables(session)


@router.put("/{session_id}/variables/{var_id}", response_model=VariableInfo)
async def set_variable(
    var_id: str,
    req: SetVariableRequest,
    session: SessionDep,
    manager: ManagerDep,
) -> VariableInfo:
    """Set an input variable to a value or an error, once (409 if set already or produced by a call)."""
    return manager.set_variable(session, var_id, req.value, req.error)


@router.get("/{session_id}/variables/{var_id}", response_model=VariableValue)
async def get_variable(
    request: Request,
    var_id: str,
    session: SessionDep,
    manager: ManagerDep,
    criteria: Annotated[Criteria, Query()] = Criteria.LATENCY,
    timeout_s: Annotated[float, Query(gt=0, le=MAX_GET_TIMEOUT_S)] = 60.0,
) -> VariableValue:
    """Wait until the variable is ready (408 after timeout_s); a failed variable answers with its
    error. A client that disconnects ends the wait (it no longer keeps the session alive)."""
    return await unless_disconnected(request, manager.get_variable(session, var_id, criteria, timeout_s))


@router.get(
    "/{session_id}/variables/{var_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {"schema": StreamChunk.model_json_schema()}}}},
)
async def stream_variable(
    var_id: str,
    session: SessionDep,
    manager: ManagerDep,
    criteria: Annotated[Criteria, Query()] = Criteria.LATENCY,
    timeout_s: Annotated[float, Query(gt=0, le=MAX_GET_TIMEOUT_S)] = MAX_GET_TIMEOUT_S,
) -> StreamingResponse:
    """The variable's text as NDJSON StreamChunk lines while it is generated; the last has done or
    error (408 when it is not done within timeout_s: a stream never holds a session forever)."""
    chunks = await manager.stream_variable(session, var_id, criteria, timeout_s)
    return StreamingResponse(_ndjson(chunks), media_type="application/x-ndjson")


async def _ndjson(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        async for text in chunks:
            yield StreamChunk(text=text).model_dump_json() + "\n"
    except ParrotError as e:
        error = ErrorBody(message=e.message, field=e.field, status=e.status)
        yield StreamChunk(error=error).model_dump_json() + "\n"
        return
    yield StreamChunk(done=True).model_dump_json() + "\n"
