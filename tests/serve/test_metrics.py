"""`GET /metrics` after a map-reduce on the real (tiny) engine: Prometheus text with per-objective
queue and latency histograms, prefix reuse at Semantic Variable boundaries, engine KV and heartbeats;
`GET /v1/status` and a session's DAG; operator keys guard them. Each server has its own registry."""

from __future__ import annotations

import collections
import re
import time
from pathlib import Path

import httpx
from live_server import LiveServer, live_server
from prometheus_client.parser import text_string_to_metric_families

from parrot.engine.async_engine import AsyncEngine
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig
from parrot.serve.runtime.call_run import CallState

GRAFANA = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "parrot.json"
SMALL = SamplingParams(max_tokens=4, ignore_eos=True)


@semantic_function(sampling=SMALL)
def summarize(chunk: Input, summary: Output):
    """You are a careful editor. Read the part of the report below and write one short sentence that keeps its main fact, names every person it mentions and leaves out opinions and repetitions. Part: {{input:chunk}}
    Sentence:{{output:summary}}"""  # noqa: E501


@semantic_function(sampling=SMALL)
def combine(a: Input, b: Input, c: Input, d: Input, summary: Output):
    """Combine {{input:a}} / {{input:b}} / {{input:c}} / {{input:d}} into one summary:{{output:summary}}"""


def scrape(url: str, key: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of every sample on /metrics."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(f"{url}/metrics", headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), sample.value))
    return out


def by_label(samples: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in samples}


def run_map_reduce(server: LiveServer) -> str:
    parts = ["Ann opened the shop.", "Bob fixed the roof.", "Cy sold the car.", "Di planted trees."]
    with Session(server.url, api_key="k") as s:
        reduced = combine(*[summarize(p) for p in parts])
        reduced.get()
        session = server.manager.sessions.sessions[s.session_id]
        deadline = time.monotonic() + 30
        while any(r.state is not CallState.DONE for r in session.runs.values()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        runs = dict(session.runs)
        status = httpx.get(f"{server.url}/v1/status").json()
        dag = httpx.get(f"{server.url}/v1/status/sessions/{s.session_id}/dag").json()
        svg = httpx.get(f"{server.url}/v1/status/sessions/{s.session_id}/dag.svg")
        metrics = scrape(server.url)
    # While the session was alive: its DAG size, the status and the DAG routes.
    assert by_label(metrics["parrot:session_dag_calls"], "session_id")[s.session_id] == 5
    assert by_label(metrics["parrot:session_dag_variables"], "session_id")[s.session_id] == 9
    [mine] = [x for x in status["sessions"] if x["session_id"] == s.session_id]
    assert [mine["num_calls"], mine["num_calls_done"], mine["num_variables"]] == [5, 5, 9]
    assert mine["num_cached_tokens"] == sum(r.num_cached_tokens for r in runs.values())
    calls = {n["node_id"]: n for n in dag["nodes"] if n["kind"] == "call"}
    assert sorted(calls) == ["c0", "c1", "c2", "c3", "c4"]
    assert [calls[c]["state"] for c in sorted(calls)] == ["done"] * 5
    assert [calls[c]["objective"] for c in sorted(calls)] == [runs[c].objective.value for c in sorted(calls)]
    assert len(dag["edges"]) == 4 + 4 + 4 + 1  # 4 inputs -> maps -> 4 outputs -> reduce -> 1 output
    assert svg.status_code == 200
    assert svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.count('class="node call state_done objective_') == 5
    # The Grafana dashboard queries only metrics the manager exports.
    assert sorted(set(re.findall(r"parrot:[a-z_]+", GRAFANA.read_text())) - set(metrics)) == []
    return s.session_id


def test_metrics_after_a_map_reduce(server: LiveServer) -> None:
    assert "parrot:prompt_tokens_reused_total" not in scrape(server.url)  # a new manager: nothing yet
    run_map_reduce(server)
    deadline = time.monotonic() + 10  # a fast run may end before the first heartbeat (every 0.5 s)
    while True:
        m = scrape(server.url)
        if sum(v for _, v in m["parrot:engine_heartbeats_total"]) >= 1:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    finished = by_label([x for x in m["parrot:calls_finished_total"] if x[0]["state"] == "done"], "objective")
    assert sum(finished.values()) >= 5
    # Queue time and TTFT per objective: one observation per finished call, under its objective.
    queue = by_label(m["parrot:request_queue_time_seconds_count"], "objective")
    ttft = by_label(m["parrot:time_to_first_token_seconds_count"], "objective")
    tpot = by_label(m["parrot:time_per_output_token_seconds_count"], "objective")
    assert queue == finished
    assert ttft == finished
    assert tpot == finished  # 4 tokens each: every call has a time per output token
    # The maps share the editor's instructions: prefix reuse at a Semantic Variable boundary.
    reused = by_label(m["parrot:prompt_tokens_reused_total"], "source")
    assert reused["variable"] > 0
    assert sum(reused.values()) >= 3 * 32  # three maps reuse >= min_prefix_tokens each
    prompt = sum(v for _, v in m["parrot:prompt_tokens_total"])
    computed = sum(v for _, v in m["parrot:prompt_tokens_computed_total"])
    assert prompt - computed == sum(reused.values())
    assert sum(v for _, v in m["parrot:generation_tokens_total"]) == 4 * sum(finished.values())
    # Queue gauges exist for both objectives (zero now: nothing waits).
    assert by_label(m["parrot:num_requests_queued"], "objective") == {"latency": 0.0, "throughput": 0.0}
    assert by_label(m["parrot:num_requests_running"], "objective") == {"latency": 0.0, "throughput": 0.0}
    # The engine: alive, heartbeats answered, KV blocks used + free = its pool, vLLM-style usage.
    [engine_id] = server.manager.pool.handles
    assert by_label(m["parrot:engine_up"], "engine_id") == {engine_id: 1.0}
    assert by_label(m["parrot:engine_heartbeats_total"], "engine_id")[engine_id] >= 1
    used = by_label(m["parrot:num_kv_blocks_used"], "engine_id")[engine_id]
    free = by_label(m["parrot:num_kv_blocks_free"], "engine_id")[engine_id]
    assert used + free == 4096
    assert by_label(m["parrot:kv_cache_usage_perc"], "engine_id")[engine_id] == used / 4096
    assert by_label(m["parrot:engine_prompt_tokens_reused_total"], "engine_id")[engine_id] > 0
    assert by_label(m["parrot:num_preemptions_total"], "engine_id") == {engine_id: 0.0}
    status = httpx.get(f"{server.url}/v1/status").json()
    assert status["num_reused_tokens"] == sum(reused.values())
    assert status["prefix_hit_rate"] == sum(reused.values()) / prompt
    assert [q["objective"] for q in status["queues"]] == ["latency", "throughput"]


def test_two_servers_in_one_process_have_their_own_registries(tiny_engine: AsyncEngine) -> None:
    config = ManagerConfig(auth=AuthConfig(api_keys=("tenant",), operator_keys=("op",)))
    with live_server(tiny_engine, config) as a, live_server(tiny_engine) as b:
        assert a.manager.metrics.registry is not b.manager.metrics.registry
        # With operator keys, the operator routes need one: none 401, a tenant's 403.
        for path in ("/metrics", "/v1/status", "/v1/status/sessions/nope/dag"):
            assert httpx.get(f"{a.url}{path}").status_code == 401
            assert httpx.get(f"{a.url}{path}", headers={"Authorization": "Bearer tenant"}).status_code == 403
        r = httpx.get(f"{a.url}/v1/status/sessions/nope/dag", headers={"Authorization": "Bearer op"})
        assert [r.status_code, r.json()["error"]["field"]] == [404, "session_id"]
        assert scrape(a.url, "op")["parrot:num_sessions"] == [({}, 0.0)]
        # Open access (development): no key needed.
        assert scrape(b.url)["parrot:num_sessions"] == [({}, 0.0)]
