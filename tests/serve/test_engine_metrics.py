"""The engine server's `GET /metrics`: vLLM-style names, its stats as gauges and counters, and the
generating Extend streams it served timed by objective; each engine app has its own registry."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.app import create_engine_app
from parrot.web.server_thread import ServerThread


def samples(text: str) -> dict[str, float]:
    """Sample name (with its labels other than model_name) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "le"))
            if "le" in s.labels:
                continue
            out[s.name + (f"{{{extra}}}" if extra else "")] = s.value
    return out


def test_engine_metrics_after_a_fill_and_a_generating_extend(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as a, ServerThread(create_engine_app(tiny_engine)) as b:
        before = samples(httpx.get(f"{a.url}/metrics").text)
        prompt = list(range(10, 50))
        r = httpx.post(f"{a.url}/v1/engine/extend", json={"context_id": "m-parent", "token_ids": prompt})
        assert r.status_code == 200
        body = {
            "context_id": "m-child",
            "parent_context_id": "m-parent",
            "token_ids": [7, 8],
            "objective": "throughput",
            "sampling": {"max_tokens": 5, "ignore_eos": True},
        }
        with httpx.stream("POST", f"{a.url}/v1/engine/extend", json=body) as stream:
            lines = list(stream.iter_lines())
        assert len(lines) == 5
        assert httpx.get(f"{a.url}/v1/engine/stats").status_code == 200
        m = samples(httpx.get(f"{a.url}/metrics").text)
        for ctx in ("m-parent", "m-child"):
            httpx.post(f"{a.url}/v1/engine/free", json={"context_id": ctx})
        # The other app's registry saw none of it.
        other = samples(httpx.get(f"{b.url}/metrics").text)
    assert m["parrot:time_to_first_token_seconds_count{objective=throughput}"] == 1
    assert m["parrot:time_per_output_token_seconds_count{objective=throughput}"] == 1
    assert m["parrot:request_success_total{finished_reason=length}"] == 1
    assert m["parrot:engine_stats_requests_total"] == 1
    assert m["parrot:engine_up"] == 1
    # Counters from the engine's own stats (the engine is shared by the test session: deltas).
    assert m["parrot:prompt_tokens_total"] - before["parrot:prompt_tokens_total"] == 40 + 2
    assert m["parrot:generation_tokens_total"] - before["parrot:generation_tokens_total"] == 5
    # A fork reuses its parent's KV but the last token, which it computes itself (Lease.reuse).
    assert m["parrot:prompt_tokens_reused_total"] - before["parrot:prompt_tokens_reused_total"] == 39
    assert m["parrot:num_kv_blocks_used"] + m["parrot:num_kv_blocks_free"] == 4096
    assert m["parrot:kv_cache_usage_perc"] == m["parrot:num_kv_blocks_used"] / 4096
    assert "parrot:num_preemptions_total" in m
    assert "parrot:time_to_first_token_seconds_count{objective=throughput}" not in other
