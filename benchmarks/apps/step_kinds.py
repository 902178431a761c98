"""An engine step trace (`LLMEngine.start_trace`) summed by kind of step: decode-only, prefill-only
and mixed, each with its steps, time, decode rows and prefill tokens. `benchmarks.apps.step_profile`
prints these; `benchmarks.apps` keeps them in each builtin-engine run's record (`steps`), and
`benchmarks.sim.fit_cpu` fits the simulator's CPU step costs from either."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from parrot.engine.llm_engine import LLMEngine
from parrot.engine.trace import StepRecord

KINDS = ("decode", "prefill", "mixed")


@dataclass
class KindSummary:
    steps: int = 0
    seconds: float = 0.0
    decode_rows: int = 0
    prefill_tokens: int = 0

    def add(self, r: StepRecord) -> None:
        self.steps += 1
        self.seconds += r.elapsed_s
        self.decode_rows += r.num_decode
        self.prefill_tokens += r.num_prefill_tokens


def kind_of(r: StepRecord) -> str:
    if r.num_decode and r.num_prefill_tokens:
        return "mixed"
    return "decode" if r.num_decode else "prefill"


def summarize(trace: list[StepRecord]) -> dict[str, KindSummary]:
    out = {k: KindSummary() for k in KINDS}
    for r in trace:
        out[kind_of(r)].add(r)
    return out


def start(server: Any) -> tuple[LLMEngine, int] | None:
    """The builtin engine a benchmark server runs in this process (`LocalServer.engine.engine`),
    its step trace started (or, when a profiler's trace is already on, the steps it holds), for
    `stop`; None for any other server."""
    engine = getattr(getattr(server, "engine", None), "engine", None)
    if not isinstance(engine, LLMEngine):
        return None
    return engine, -1 if engine.start_trace() else len(engine.stop_trace(keep=True))


def stop(traced: tuple[LLMEngine, int]) -> dict[str, dict[str, Any]]:
    """The steps traced since `start`, by kind (JSON-ready); the trace stops if `start` began it
    (a profiler's goes on: `benchmarks.apps.step_profile` reads every step of the same runs)."""
    engine, before = traced
    steps = engine.stop_trace() if before < 0 else engine.stop_trace(keep=True)[before:]
    return {k: asdict(v) for k, v in summarize(steps).items()}
