"""What the client-side commands share: the manager's URL and key, and `GET /v1/status`."""

from __future__ import annotations

import argparse
import os

import httpx

from parrot.protocol.ops_api import ClusterStatus

URL_ENV, KEY_ENV = "PARROT_URL", "PARROT_API_KEY"


def manager_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url", default=os.environ.get(URL_ENV, "http://127.0.0.1:8000"), help=f"the manager (default: ${URL_ENV})"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get(KEY_ENV, "parrot"),
        help=f"an operator key (default: ${KEY_ENV}, else any key: a development manager takes it)",
    )


def fetch_status(http: httpx.Client) -> ClusterStatus:
    """The cluster status; SystemExit with the manager's message when it refuses."""
    try:
        r = http.get("/v1/status")
    except httpx.HTTPError as e:
        raise SystemExit(f"cannot reach the manager at {http.base_url}: {e}") from None
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        raise SystemExit(f"the manager answered {r.status_code}: {message}")
    return ClusterStatus.model_validate(r.json())


def client(a: argparse.Namespace) -> httpx.Client:
    return httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.api_key}"}, timeout=10.0)


def savings(before: ClusterStatus, after: ClusterStatus) -> str:
    """What Parrot saved between two statuses: client round trips (a request-level client pays one
    per call; here only the variables it fetched) and prompt tokens reused from shared prefixes."""
    calls = after.num_calls_finished - before.num_calls_finished
    gets = after.num_variable_gets - before.num_variable_gets
    prompt = after.num_prompt_tokens - before.num_prompt_tokens
    reused = after.num_reused_tokens - before.num_reused_tokens
    generated = after.num_generated_tokens - before.num_generated_tokens
    share = f" ({reused / prompt:.0%})" if prompt else ""
    return (
        f"{calls} calls finished, {generated} tokens generated; saved {max(calls - gets, 0)} client round trips "
        f"({gets} fetches instead of {calls} requests) and reused {reused} of {prompt} prompt tokens "
        f"from shared prefixes{share}"
    )
