"""The real manager, unchanged, over simulated engines on the virtual clock: a chain of calls
runs end to end, deterministically, in virtual time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve.clock import LoopClock
from parrot.serve.config import ManagerConfig
from parrot.serve.manager import create_manager
from parrot.sim.engine import SimEngine
from parrot.sim.loop import run_virtual
from parrot.sim.profiles import HardwareProfile, Setup, model

HW = HardwareProfile(
    "toy",
    "",
    peak_tflops=1e12,
    mem_gb=1.0,
    mem_bw_gbps=1e12,
    mfu=1.0,
    bw_efficiency=1.0,
    step_overhead_ms=10.0,
    row_overhead_ms=0.0,
    combine="max",
    gpu_mem_util=1.0,
)


def run_chain(folder: Path) -> tuple[float, list[str], list[int]]:
    setup = Setup(
        "toy",
        "",
        HW,
        model("smollm2-135m"),
        block_size=16,
        max_num_batched_tokens=256,
        latency_max_batched_tokens=256,
        max_model_len=4096,
        num_blocks=512,
        engines=2,
    )
    engines = [SimEngine(setup, folder), SimEngine(setup, folder)]
    out = SamplingParams(max_tokens=4, ignore_eos=True)

    async def main() -> tuple[float, list[str], list[int]]:
        manager = create_manager(engines, config=ManagerConfig(), clock=LoopClock())
        await manager.start()
        try:
            created = manager.create_session("key")
            session = manager.session(created.session_id, created.token)
            calls = [
                CallSpec(
                    template="Summarize: alpha beta gamma.{{output:o}}",
                    bindings={"o": Binding(var_id="s0")},
                    sampling={"o": out},
                ),
                CallSpec(
                    template="Refine {{input:p}} with delta.{{output:o}}",
                    bindings={"p": Binding(var_id="s0"), "o": Binding(var_id="s1")},
                    sampling={"o": out},
                ),
            ]
            variables = [VariableSpec(var_id="s0"), VariableSpec(var_id="s1")]
            manager.submit(session, SubmitRequest(variables=variables, calls=calls))
            final = await manager.get_variable(session, "s1", Criteria.LATENCY)
            first = await manager.get_variable(session, "s0")
            now = asyncio.get_running_loop().time()
            return now, [first.value or "", final.value or ""], [e.counters.num_steps for e in engines]
        finally:
            await manager.stop()

    return run_virtual(main())


def test_the_manager_runs_a_chain_over_simulated_engines_in_virtual_time(default_model_folder: Path) -> None:
    end, values, steps = run_chain(default_model_folder)
    # Each output is exactly 4 simulated tokens; the second call read the first's value.
    assert values == [" the the the the", " the the the the"]
    # Each call: one step prefills its prompt and samples its first token, 3 decode steps: 4 steps
    # of 10 ms; the chain is two such calls one after the other, on one engine (app affinity).
    assert sorted(steps) == [0, 8]
    assert end == run_chain(default_model_folder)[0]  # deterministic
    assert round(end, 6) == 0.08
