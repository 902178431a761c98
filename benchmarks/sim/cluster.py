"""A simulated cluster and the two kinds of clients the paper compares.

`Cluster`: the real manager (parrot.serve) over `num_engines` SimEngines of one setup, on the
running (virtual-time) loop. `Config`: Parrot or a request-level baseline, as in
benchmarks/apps/configs.py: Parrot (SDK, app-centric policy, prefix sharing, shared-prefix attention,
the engine's latency cap), (a) latency-centric (request-level, FIFO, latency cap, no sharing),
(b) throughput-centric (no cap), (c) (b) with prefix sharing.

An application is a DAG of `Call`s. `run_parrot` submits the whole DAG in one session (one round
trip: half before the submission, half after the final value); `run_requests` is a request-level
client: each call, once its inputs are known, is rendered on the client and sent alone (its own
one-call session, latency criteria), paying a round trip per call.
"""

from __future__ import annotations

import asyncio
import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common.netsim import RttSampler
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece, escape_text
from parrot.serve import Manager, ManagerConfig, create_manager
from parrot.serve.clock import LoopClock
from parrot.serve.config import LimitsConfig, SchedulingConfig, SharingConfig
from parrot.sim.cost import DecodeGroup, StepCostModel, StepShape
from parrot.sim.engine import SimEngine
from parrot.sim.profiles import Setup


def tokenizer_folder() -> Path:
    """The default model's tokenizer, converted once by the builtin engine's loader (no import of it)."""
    root = Path(os.environ.get("PARROT_CACHE", Path.home() / ".cache" / "parrot"))
    found = sorted(glob.glob(str(root / "SmolLM2-135M-Instruct*" / "tokenizer.json")))
    if not found:
        raise FileNotFoundError(f"no SmolLM2 tokenizer under {root}: run `make demo` (or `parrot chat hi`) once")
    return Path(found[0]).parent


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    parrot: bool
    prefix_sharing: bool
    latency_cap: bool  # the engine caps a step's tokens while latency-critical work decodes
    shared_prefix_attention: bool = False
    policy: str = "fifo"


CONFIGS = {
    "parrot": Config("parrot", "Parrot", True, True, True, True, "app_centric"),
    "a": Config("a", "(a) latency-centric", False, False, True),
    "b": Config("b", "(b) throughput-centric", False, False, False),
    "c": Config("c", "(c) throughput + prefix reuse", False, True, False),
    "parrot_noaff": Config("parrot_noaff", "Parrot w/o affinity (FIFO)", True, True, True, True, "fifo"),
}


def tpot_target_ms(setup: Setup) -> float:
    """Parrot's latency goal: the time per token the latency cap gives, a step of that many rows of
    1k tokens (benchmarks/apps/run.py uses baseline (a)'s measured time per token the same way)."""
    model = StepCostModel(setup.hardware, setup.model)
    rows = tuple([1024] * setup.latency_max_batched_tokens)
    return model.step_s(StepShape(decodes=(DecodeGroup(rows),))) * 1000.0


class Cluster:
    def __init__(self, setup: Setup, config: Config, num_engines: int | None = None) -> None:
        self.setup = setup
        self.config = config
        folder = tokenizer_folder()
        cap = None if config.latency_cap else setup.max_num_batched_tokens
        n = setup.engines if num_engines is None else num_engines
        self.engines = [SimEngine(setup, folder, config.shared_prefix_attention, cap) for _ in range(n)]
        # Every app is submitted by one tenant ("sim"), up to 10k at the same virtual instant: the
        # per-tenant quotas and rate limit (a production manager's defaults) are lifted.
        limits = LimitsConfig(
            max_sessions=10**6,
            max_sessions_per_tenant=10**6,
            max_open_calls_per_tenant=10**7,
            max_tokens_in_flight_per_tenant=10**12,
            max_requests_per_s_per_tenant=1e12,
            request_burst_per_tenant=10**9,
        )
        scheduling = SchedulingConfig(
            policy=config.policy, objective_deduction=config.parrot, tpot_target_ms=tpot_target_ms(setup)
        )
        self.manager: Manager = create_manager(
            self.engines,
            config=ManagerConfig(
                limits=limits, scheduling=scheduling, sharing=SharingConfig(prefix_sharing=config.prefix_sharing)
            ),
            clock=LoopClock(),
        )

    async def __aenter__(self) -> Cluster:
        await self.manager.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.manager.stop()
        for engine in self.engines:
            await engine.aclose()


# ---- applications -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    name: str  # an earlier call's output


@dataclass(frozen=True)
class Input:
    value: str  # a value the application passes in (a chunk, a user query): a Semantic Variable for Parrot


@dataclass(frozen=True)
class Call:
    """One semantic call: constant text, inputs and references to earlier outputs, then one output."""

    pieces: tuple[str | Ref | Input, ...]
    output: str
    max_tokens: int


@dataclass
class AppResult:
    start_s: float
    end_s: float
    values: dict[str, str] = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


def now() -> float:
    return asyncio.get_running_loop().time()


def _sampling(call: Call) -> dict[str, SamplingParams]:
    return {"out": SamplingParams(max_tokens=call.max_tokens, ignore_eos=True)}


async def run_parrot(
    manager: Manager, calls: list[Call], finals: list[str], rtt: RttSampler, criteria: Criteria = Criteria.LATENCY
) -> AppResult:
    """The whole DAG in one submission; the client reads `finals` (one round trip in all)."""
    start = now()
    half = rtt.draw_s() / 2
    await asyncio.sleep(half)
    created = manager.create_session("sim")
    session = manager.session(created.session_id, created.token)
    specs = []
    for call in calls:
        template, bindings = "", {}
        for i, piece in enumerate(call.pieces):
            if isinstance(piece, Ref):
                template += f"{{{{input:i{i}}}}}"
                bindings[f"i{i}"] = Binding(var_id=piece.name)
            elif isinstance(piece, Input):
                template += f"{{{{input:i{i}}}}}"
                bindings[f"i{i}"] = Binding(value=piece.value)
            else:
                template += escape_text(piece)
        bindings["out"] = Binding(var_id=call.output)
        specs.append(CallSpec(template=template + "{{output:out}}", bindings=bindings, sampling=_sampling(call)))
    variables = [VariableSpec(var_id=c.output) for c in calls]
    manager.submit(session, SubmitRequest(variables=variables, calls=specs))
    got = await asyncio.gather(*(manager.get_variable(session, f, criteria, timeout_s=10**7) for f in finals))
    await asyncio.sleep(half)
    await manager.delete_session(session)
    return AppResult(start, now(), {f: g.value or "" for f, g in zip(finals, got, strict=True)})


async def run_requests(manager: Manager, calls: list[Call], finals: list[str], rtt: RttSampler) -> AppResult:
    """A request-level client: each call alone once its inputs are known, a round trip each."""
    start = now()
    done: dict[str, asyncio.Future[str]] = {c.output: asyncio.get_running_loop().create_future() for c in calls}

    async def one(call: Call) -> None:
        text = ""
        for piece in call.pieces:
            if isinstance(piece, Ref):
                text += await done[piece.name]
            else:
                text += piece.value if isinstance(piece, Input) else piece
        half = rtt.draw_s() / 2
        await asyncio.sleep(half)
        created = manager.create_session("sim")
        session = manager.session(created.session_id, created.token)
        # As the OpenAI route sends a plain prompt: one text piece (prefix points every
        # prefix_block_tokens tokens when the manager shares prefixes), latency-critical.
        template = ParsedTemplate((TextPiece(text), Placeholder("out", PlaceholderKind.OUTPUT)), (), ("out",))
        spec = CallSpec(template=text, sampling=_sampling(call))
        (node,) = manager.submit_parsed(session, [spec], template)
        value = await manager.get_variable(session, node.outputs["out"], Criteria.LATENCY, timeout_s=10**7)
        await manager.delete_session(session)
        await asyncio.sleep(half)
        done[call.output].set_result(value.value or "")

    await asyncio.gather(*(one(c) for c in calls))
    return AppResult(start, now(), {f: done[f].result() for f in finals})


async def run_app(
    cluster: Cluster, calls: list[Call], finals: list[str], rtt: RttSampler, criteria: Criteria = Criteria.LATENCY
) -> AppResult:
    if cluster.config.parrot:
        return await run_parrot(cluster.manager, calls, finals, rtt, criteria)
    return await run_requests(cluster.manager, calls, finals, rtt)
