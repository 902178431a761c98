"""Schemathesis against both servers' OpenAPI documents, over real HTTP on loopback: at least
1,000 generated requests each, and every answer is what the document says (no 5xx, status codes
and bodies that the document lists, strict types, a 405 that names the allowed methods, auth
required where declared) within a time limit (no hangs).

One check is left out: `positive_data_acceptance` expects every schema-valid request to succeed,
but many are refused for reasons no schema states (a template without an output, a model the
server does not serve, a session id that does not exist); those answers are 4xx naming the field,
which the other checks already hold to the document.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from live_server import live_server, start_tiny_engine
from schemathesis.checks import positive_data_acceptance

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.model.loader import write_tiny_model
from parrot.engine.server.app import create_engine_app
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig, LimitsConfig
from parrot.web.server_thread import ServerThread

CASES_PER_API = 1000
TIMEOUT_S = 20.0  # an answer later than this is a hang


@pytest.fixture(scope="module")
def short_engine(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Iterator[AsyncEngine]:
    """A tiny model with a 256-token context, so a fuzzed max_tokens ends within a second."""
    folder = write_tiny_model(
        tmp_path_factory.mktemp("fuzz") / "tiny256", tokenizer_from=default_model_folder, max_position_embeddings=256
    )
    engine = start_tiny_engine(folder, num_blocks=512)
    yield engine
    engine.stop()


def fuzz(base_url: str, authorize: Callable[[schemathesis.Case, int], None]) -> tuple[int, dict[str, str]]:
    """(cases run, failures by operation and kind) over every operation of the server's document,
    in rounds (each with new random examples) until the run has made CASES_PER_API requests."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    cases = 0
    failures: dict[str, str] = {}
    kinds: collections.Counter[str] = collections.Counter()

    def fuzz_one(operation: schemathesis.APIOperation) -> None:
        @settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            nonlocal cases
            cases += 1
            authorize(case, cases)
            try:
                case.call_and_validate(timeout=TIMEOUT_S, excluded_checks=[positive_data_acceptance])
            except BaseException as error:  # a FailureGroup, a timeout: record and keep fuzzing
                summary = " | ".join(line for line in str(error).splitlines() if line.startswith("- ")) or repr(error)
                key = f"{operation.label}: {summary[:300]}"
                kinds[key] += 1
                failures.setdefault(key, str(error)[:2000])

        run()

    while cases < CASES_PER_API:  # operations without inputs run one case a round
        for operation in operations:
            fuzz_one(operation)
    return cases, {k: f"x{kinds[k]}\n{failures[k]}" for k in failures}


def test_the_manager_api_holds_to_its_document(short_engine: AsyncEngine) -> None:
    config = ManagerConfig(
        auth=AuthConfig(api_keys=("tenant",), operator_keys=("operator",)),
        limits=LimitsConfig(max_sessions_per_tenant=100_000),
    )
    with live_server(short_engine, config) as srv, httpx.Client(base_url=srv.url, timeout=TIMEOUT_S) as http:

        def new_session() -> dict[str, str]:
            created = http.post("/v1/sessions", json={}, headers={"Authorization": "Bearer tenant"})
            assert created.status_code == 201, created.text
            return created.json()

        def authorize(case: schemathesis.Case, n: int) -> None:
            path = case.operation.path
            key = "operator" if path.startswith("/v1/engines") else "tenant"
            if path.startswith("/v1/sessions/"):
                session = new_session()  # fuzzed requests may delete it: one per case
                key = session["token"]
                if n % 2 == 0:  # half on the live session's own id, half on generated ids
                    assert case.path_parameters is not None
                    case.path_parameters["session_id"] = session["session_id"]
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}

        cases, failures = fuzz(srv.url, authorize)
        assert failures == {}
        assert cases >= CASES_PER_API
        assert http.get("/health").status_code == 200  # still serving


def test_the_engine_api_holds_to_its_document(short_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(short_engine)) as srv:
        cases, failures = fuzz(srv.url, lambda case, n: None)
        assert failures == {}
        assert cases >= CASES_PER_API
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT_S) as http:
            assert http.get("/v1/engine/stats").status_code == 200
