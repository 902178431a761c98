"""The engine server's Prometheus metrics (`GET /metrics`), named as vLLM's where they mean the same.

One `EngineMetrics` per engine app, with its own `CollectorRegistry` (never the global one), so
several engine servers in one process (tests) do not clash. Histograms and counters are observed
by the app as its generating Extend streams pass (time to first token from the request's arrival, time per
output token, finish reasons, by the request's objective); gauges and the engine's own counters
(prefill and decode tokens, tokens reused by forks, preemptions, KV blocks) are read from
`EngineStats` at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from parrot.protocol.engine_api import EngineStats, TokenEvent

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "parrot:time_to_first_token_seconds",
            "Time from a generating Extend request's arrival to its first token",
            ["objective"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "parrot:time_per_output_token_seconds",
            "A generation's mean time per output token after the first",
            ["objective"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "parrot:request_success", "Generations finished, by finish reason", ["finished_reason"], registry=r
        )
        self.heartbeats = Counter("parrot:engine_stats_requests", "Stats requests answered (heartbeats)", registry=r)
        self._state = _StatsCollector()
        r.register(self._state)

    async def observe(self, objective: str, events: AsyncIterator[TokenEvent]) -> AsyncGenerator[TokenEvent, None]:
        """`events`, passed through, timed from now; closing this closes `events` (the engine
        aborts a generation whose reader went away)."""
        start = time.monotonic()
        first: float | None = None
        num_tokens = 0
        try:
            async for event in events:
                if event.token_id is not None:
                    num_tokens += 1
                    if first is None:
                        first = time.monotonic()
                        self.ttft.labels(objective).observe(first - start)
                if event.finish_reason is not None:
                    self.finished.labels(event.finish_reason).inc()
                    if first is not None and num_tokens > 1:
                        self.tpot.labels(objective).observe((time.monotonic() - first) / (num_tokens - 1))
                yield event
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def render(self, stats: EngineStats) -> bytes:
        """The text format, with the gauges of `stats` (the engine's, read just before)."""
        self._state.stats = stats
        return generate_latest(self.registry)


class _StatsCollector(Collector):
    def __init__(self) -> None:
        self.stats: EngineStats | None = None

    def collect(self) -> list[Metric]:
        st = self.stats
        if st is None:
            return []
        labels = {"model_name": st.model}
        out: list[Metric] = []
        used = st.num_blocks_total - st.num_blocks_free
        for name, doc, value in (
            ("engine_up", "1: the engine answers", 1.0),
            ("num_requests_running", "Generations in the engine's running batch", st.num_running),
            ("num_requests_waiting", "Requests waiting in the engine's queue", st.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV blocks in use (0 to 1)", used / max(st.num_blocks_total, 1)),
            ("num_kv_blocks_used", "KV cache blocks in use", used),
            ("num_kv_blocks_free", "KV cache blocks free", st.num_blocks_free),
            ("num_contexts", "Contexts the engine holds", st.num_contexts),
            (
                "recent_time_per_output_token_ms",
                "Recent time per output token (ms)",
                st.recent_time_per_output_token_ms,
            ),
        ):
            g = GaugeMetricFamily(f"parrot:{name}", doc, labels=list(labels))
            g.add_metric(list(labels.values()), value)
            out.append(g)
        for name, doc, value in (
            (
                "prompt_tokens",
                "Prompt tokens computed (recomputation after preemption included)",
                st.num_prefill_tokens,
            ),
            ("generation_tokens", "Tokens generated", st.num_decode_tokens),
            ("prompt_tokens_reused", "Prompt tokens forks took from their parents' KV blocks", st.num_reused_tokens),
            ("num_preemptions", "Generations preempted to free KV blocks", st.num_preemptions),
            ("engine_steps", "Engine steps run", st.num_steps),
        ):
            c = CounterMetricFamily(f"parrot:{name}", doc, labels=list(labels))
            c.add_metric(list(labels.values()), value)
            out.append(c)
        return out
