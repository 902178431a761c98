"""The manager's Prometheus metrics (`GET /metrics`), named and labelled as vLLM's where the meaning
is the same (`vllm:num_requests_running` -> `parrot:num_requests_running`).

Owned by the manager, one `ServeMetrics` per manager with its own `CollectorRegistry` (never the
global one), so several managers in one process (tests) do not clash. Two kinds of metrics:
- events, observed when a call finishes (the executor's `on_finish` hook) or an engine answers a
  heartbeat: histograms (queue time, time to first token, time per output token, inference time)
  and counters (calls finished, prompt tokens computed and reused by prefix source, generated
  tokens, heartbeats), labelled by the call's deduced objective;
- state, read at scrape time from the live sessions and engine handles (`_StateCollector`): calls
  by state and objective, per-session DAG sizes, engine health, heartbeat age, KV blocks, and the
  counters each engine reports in its stats (prefill, decode, reused tokens, preemptions).
"""

from __future__ import annotations

import collections

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from parrot.protocol.objective import Objective
from parrot.serve.runtime.call_run import CallRun, CallState
from parrot.serve.runtime.engines import EnginePool
from parrot.serve.runtime.prefix_cache import PrefixCache
from parrot.serve.runtime.session import SessionRegistry

# vLLM's buckets for the same histograms, so the same dashboards read both.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
LATENCY_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
OBJECTIVES = tuple(o.value for o in Objective)
STATES = tuple(s.value for s in CallState)


class ServeMetrics:
    def __init__(self, sessions: SessionRegistry, pool: EnginePool, prefix_cache: PrefixCache) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, by_objective = self.registry, ["objective"]
        self.queue_time = Histogram(
            "parrot:request_queue_time_seconds",
            "Time a call waited with every input set until it was dispatched to an engine",
            by_objective,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "parrot:time_to_first_token_seconds",
            "Time from a call's dispatch to its first generated token",
            by_objective,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "parrot:time_per_output_token_seconds",
            "A call's mean time per output token after the first",
            by_objective,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "parrot:request_inference_time_seconds",
            "Time from a call's dispatch to its end",
            by_objective,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "parrot:calls_finished", "Calls finished, by final state", ["state", "objective"], registry=r
        )
        self.prompt_tokens = Counter(
            "parrot:prompt_tokens", "Prompt tokens of finished calls", by_objective, registry=r
        )
        self.computed_tokens = Counter(
            "parrot:prompt_tokens_computed", "Prompt tokens computed for finished calls", by_objective, registry=r
        )
        self.reused_tokens = Counter(
            "parrot:prompt_tokens_reused",
            "Prompt tokens finished calls reused from prefixes other calls computed, by the kind of "
            "prefix point (variable: a Semantic Variable boundary; message; block: a token block)",
            ["source"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "parrot:generation_tokens", "Tokens generated for finished calls", by_objective, registry=r
        )
        self.gets = Counter(
            "parrot:variable_gets",
            "Gets and streams of variables: the waits a client paid a round trip for",
            registry=r,
        )
        self.heartbeats = Counter("parrot:engine_heartbeats", "Heartbeats engines answered", ["engine_id"], registry=r)
        # The same sums as plain numbers, for `GET /v1/status` (prefix-cache hit rate).
        self.totals: collections.Counter[str] = collections.Counter()
        r.register(_StateCollector(sessions, pool, prefix_cache))

    def call_finished(self, run: CallRun) -> None:
        """Observed from the executor's `on_finish` (the manager's): `run` just became done or failed."""
        objective = run.objective.value
        self.finished.labels(run.state.value, objective).inc()
        computed = run.num_prompt_tokens - run.num_cached_tokens
        self.prompt_tokens.labels(objective).inc(run.num_prompt_tokens)
        self.computed_tokens.labels(objective).inc(computed)
        self.generation_tokens.labels(objective).inc(run.num_generated_tokens)
        if run.num_cached_tokens:
            self.reused_tokens.labels(run.prefix_source or "unknown").inc(run.num_cached_tokens)
        self.totals.update(
            prompt=run.num_prompt_tokens,
            reused=run.num_cached_tokens,
            generated=run.num_generated_tokens,
            calls=1,
        )
        start, first, end = run.dispatched_at, run.first_token_at, run.finished_at
        if start is None or end is None:
            return  # failed before it ran
        if run.ready_at is not None:
            self.queue_time.labels(objective).observe(max(start - run.ready_at, 0.0))
        self.inference_time.labels(objective).observe(end - start)
        if first is not None:
            self.ttft.labels(objective).observe(first - start)
            if run.num_generated_tokens > 1:
                self.tpot.labels(objective).observe((end - first) / (run.num_generated_tokens - 1))

    def variable_get(self) -> None:
        self.gets.inc()
        self.totals["gets"] += 1

    def engine_added(self, engine_id: str) -> None:
        """Its heartbeat count shows (at 0) before its first heartbeat."""
        self.heartbeats.labels(engine_id)

    def heartbeat(self, engine_id: str) -> None:
        self.heartbeats.labels(engine_id).inc()


class _StateCollector(Collector):
    """Gauges and engine-reported counters, read from the manager's state at each scrape."""

    def __init__(self, sessions: SessionRegistry, pool: EnginePool, prefix_cache: PrefixCache) -> None:
        self.sessions, self.pool, self.prefix_cache = sessions, pool, prefix_cache

    def collect(self) -> list[Metric]:
        return [*self._calls(), *self._engines()]

    def _calls(self) -> list[Metric]:
        sessions = list(self.sessions.sessions.values())
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        queued: collections.Counter[str] = collections.Counter()
        dag_calls = GaugeMetricFamily(
            "parrot:session_dag_calls", "Calls in a live session's DAG", labels=["session_id"]
        )
        dag_vars = GaugeMetricFamily(
            "parrot:session_dag_variables", "Semantic Variables in a live session's DAG", labels=["session_id"]
        )
        for s in sessions:
            dag_calls.add_metric([s.session_id], len(s.graph.calls))
            dag_vars.add_metric([s.session_id], len(s.graph.variables))
            for run in s.runs.values():
                counts[run.state.value, run.objective.value] += 1
                queued[run.objective.value] += run.state is CallState.WAITING and run.ready_since is not None
        calls = GaugeMetricFamily(
            "parrot:calls", "Calls of live sessions by state and deduced objective", labels=["state", "objective"]
        )
        running = GaugeMetricFamily("parrot:num_requests_running", "Calls running on an engine", labels=["objective"])
        waiting = GaugeMetricFamily(
            "parrot:num_requests_waiting", "Calls waiting (for an input or for an engine)", labels=["objective"]
        )
        queue = GaugeMetricFamily(
            "parrot:num_requests_queued", "Calls with every input set, waiting for an engine", labels=["objective"]
        )
        for objective in OBJECTIVES:
            for state in STATES:
                calls.add_metric([state, objective], counts[state, objective])
            running.add_metric([objective], counts[CallState.RUNNING.value, objective])
            waiting.add_metric([objective], counts[CallState.WAITING.value, objective])
            queue.add_metric([objective], queued[objective])
        num_sessions = GaugeMetricFamily("parrot:num_sessions", "Live sessions", value=len(sessions))
        return [calls, running, waiting, queue, num_sessions, dag_calls, dag_vars]

    def _engines(self) -> list[Metric]:
        labels = ["engine_id", "model"]
        g = {
            name: GaugeMetricFamily(f"parrot:{name}", doc, labels=labels)
            for name, doc in (
                ("engine_up", "1 while the engine is alive (answers heartbeats), 0 once declared dead"),
                ("engine_heartbeat_age_seconds", "Seconds since the engine last answered a heartbeat"),
                ("kv_cache_usage_perc", "Fraction of the engine's KV blocks in use (0 to 1)"),
                ("num_kv_blocks_used", "KV cache blocks in use"),
                ("num_kv_blocks_free", "KV cache blocks free"),
                ("engine_num_requests_running", "Generations the engine runs (its own count)"),
                ("engine_num_requests_waiting", "Requests queued in the engine (its own count)"),
                ("engine_running_calls", "Calls the manager has dispatched to the engine"),
                ("engine_latency_cap", "Latency-critical calls the engine may run (calibrated)"),
                ("prefix_cache_contexts", "Cached prefix contexts the manager holds on the engine"),
            )
        }
        c = {
            name: CounterMetricFamily(f"parrot:{name}", doc, labels=labels)
            for name, doc in (
                ("engine_prompt_tokens_computed", "Prompt tokens the engine computed (its stats)"),
                ("engine_prompt_tokens_reused", "Prompt tokens forks took from cached contexts (its stats)"),
                ("engine_generation_tokens", "Tokens the engine generated (its stats)"),
                ("num_preemptions", "Generations the engine preempted to free KV blocks (its stats)"),
            )
        }
        now = self.pool.clock.now()
        for h in list(self.pool.handles.values()):
            key, st = [h.engine_id, h.model], h.stats
            used = st.num_blocks_total - st.num_blocks_free
            for name, value in (
                ("engine_up", float(h.alive)),
                ("engine_heartbeat_age_seconds", now - h.last_heartbeat),
                ("kv_cache_usage_perc", used / st.num_blocks_total if st.num_blocks_total else 0.0),
                ("num_kv_blocks_used", used),
                ("num_kv_blocks_free", st.num_blocks_free),
                ("engine_num_requests_running", st.num_running),
                ("engine_num_requests_waiting", st.num_waiting),
                ("engine_running_calls", h.num_running_calls),
                ("engine_latency_cap", min(h.latency_cap, 1 << 20)),
                ("prefix_cache_contexts", len(self.prefix_cache.entries(h.engine_id))),
            ):
                g[name].add_metric(key, value)
            c["engine_prompt_tokens_computed"].add_metric(key, st.num_prefill_tokens)
            c["engine_prompt_tokens_reused"].add_metric(key, st.num_reused_tokens)
            c["engine_generation_tokens"].add_metric(key, st.num_decode_tokens)
            c["num_preemptions"].add_metric(key, st.num_preemptions)
        return [*g.values(), *c.values()]
