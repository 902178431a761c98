"""Operator routes: Prometheus metrics, the cluster status, session DAGs and the web dashboard.

    GET /metrics                                  Prometheus text format (parrot/serve/runtime/metrics.py)
    GET /v1/status                                ClusterStatus: engines, sessions, queues, prefix reuse
    GET /v1/status/sessions/{session_id}/dag      SessionDag: calls and variables, with state and placement
    GET /v1/status/sessions/{session_id}/dag.svg  the same DAG laid out by Graphviz (`dot -Tsvg`)
    GET /dashboard                                the web dashboard (a static page polling the routes above)

They show every tenant's sessions, so with operator keys configured they need one (401/403
otherwise); with open access (development) they need no key at all, so Prometheus can scrape a
development manager as is. `dot` comes from the Debian package graphviz; without it the SVG route
answers 503 saying so.
"""

from __future__ import annotations

import asyncio
import shutil
from importlib import resources

from fastapi import APIRouter, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from parrot.protocol.errors import ParrotError, not_found
from parrot.protocol.ops_api import ClusterStatus, SessionDag
from parrot.protocol.public_api import ErrorResponse
from parrot.serve.http.deps import ManagerDep
from parrot.serve.manager import Manager
from parrot.serve.runtime.overview import cluster_status, dag_dot, session_dag
from parrot.web.edge import BearerToken

_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (401, 403, 404)}
_SVG_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (422, 500, 503)}
router = APIRouter(tags=["operations"], responses=_ERRORS)
DOT_TIMEOUT_S = 10.0
MAX_SVG_NODES = 1000  # larger DAGs are not drawn (Graphviz would take seconds at every poll)


def _require_operator(manager: Manager, api_key: str | None) -> None:
    if not manager.config.auth.open_access:
        manager.sessions.require_operator(api_key)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(api_key: BearerToken, manager: ManagerDep) -> Response:
    """Every metric in the Prometheus text format (names and labels as vLLM's where they mean the same)."""
    _require_operator(manager, api_key)
    return Response(generate_latest(manager.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/status", response_model=ClusterStatus)
async def status(api_key: BearerToken, manager: ManagerDep) -> ClusterStatus:
    _require_operator(manager, api_key)
    return cluster_status(manager.sessions, manager.pool, manager.prefix_cache, manager.metrics)


def _dag(manager: Manager, session_id: str) -> SessionDag:
    session = manager.sessions.sessions.get(session_id)
    if session is None:
        raise not_found("session", session_id, "session_id")
    return session_dag(session)


@router.get("/v1/status/sessions/{session_id}/dag", response_model=SessionDag)
async def dag(session_id: str, api_key: BearerToken, manager: ManagerDep) -> SessionDag:
    _require_operator(manager, api_key)
    return _dag(manager, session_id)


@router.get(
    "/v1/status/sessions/{session_id}/dag.svg",
    response_class=Response,
    responses={200: {"content": {"image/svg+xml": {}}}, **_SVG_ERRORS},
)
async def dag_svg(session_id: str, api_key: BearerToken, manager: ManagerDep) -> Response:
    """The session's DAG as SVG: calls are boxes, variables ellipses; fill by state, a call's
    border by its deduced objective (red: latency, blue: throughput)."""
    _require_operator(manager, api_key)
    dag = _dag(manager, session_id)
    if len(dag.nodes) > MAX_SVG_NODES:
        raise ParrotError(
            f"the DAG has {len(dag.nodes)} nodes, more than the {MAX_SVG_NODES} drawn; read it as JSON at .../dag",
            status=422,
            field="session_id",
        )
    return Response(await render_svg(dag_dot(dag)), media_type="image/svg+xml")


async def render_svg(dot_text: str) -> bytes:
    """`dot -Tsvg` in a subprocess (the event loop keeps serving meanwhile)."""
    dot = shutil.which("dot")
    if dot is None:
        raise ParrotError("Graphviz `dot` is not installed here (apt-get install graphviz)", status=503)
    proc = await asyncio.create_subprocess_exec(
        dot, "-Tsvg", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(dot_text.encode()), DOT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ParrotError(f"Graphviz took over {DOT_TIMEOUT_S:g} s to lay out the DAG", status=503) from None
    if proc.returncode != 0:
        raise ParrotError(f"Graphviz failed: {err.decode(errors='replace')[:500]}", status=500)
    return out


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    """The page holds no data: its script polls /v1/status and the selected session's dag.svg."""
    return HTMLResponse(resources.files("parrot.serve.http").joinpath("dashboard.html").read_text())
