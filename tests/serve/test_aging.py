"""No starvation: a cache-cold call submitted during a flood of cache-hot calls runs within a
bounded delay (it ages to the front), while without aging it waits for the flood to end.

The app-centric policy ranks cache-hot calls first (they reuse a cached prefix); the FakeEngine
keeps this about scheduling, not compute.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from manager_harness import new_session, now, run_manager

from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.serve.config import ManagerConfig, SchedulingConfig
from parrot.serve.manager import Manager
from parrot.serve.runtime.call_run import CallRun, CallState

HOT = "You are the on-call assistant for the payments team; reply with one word only, please. " * 2


def flood_then_cold(folder: Path, aging_s: float, flood_s: float) -> tuple[float, float, int]:
    """Keep hot calls queued for `flood_s`; submit a cold call 0.3 s in. Returns (the cold call's
    wait before dispatch, its wait measured from the flood's end, hot calls dispatched meanwhile).
    Runs on the virtual clock: every time is exact and the run takes no wall time to speak of."""
    engine = FakeEngine(folder, token_delay_s=0.01)
    config = ManagerConfig(
        scheduling=SchedulingConfig(policy="app_centric", max_running_calls_per_engine=2, aging_s=aging_s)
    )
    result: list[tuple[float, float, int]] = []

    async def body(manager: Manager) -> None:
        hot = new_session(manager)
        cold = new_session(manager)
        hot_calls: list[CallRun] = []

        def submit_hot(n: int) -> None:
            specs = [
                CallSpec(template=HOT + "{{input:q}} reply:{{output:a}}", bindings={"q": Binding(value=f"q{i}")})
                for i in range(len(hot_calls), len(hot_calls) + n)
            ]
            resp = manager.submit(hot, SubmitRequest(calls=specs))
            hot_calls.extend(hot.runs[c.call_id] for c in resp.calls)

        submit_hot(1)  # caches the hot prefix
        await manager.get_variable(hot, "c0~a")
        start = now()
        cold_call: CallRun | None = None
        submitted_at = 0.0
        while now() - start < flood_s:
            waiting = sum(c.state is CallState.WAITING for c in hot_calls)
            if waiting < 6:
                submit_hot(6 - waiting)
            if cold_call is None and now() - start >= 0.3:
                spec = CallSpec(template="Cold question {{input:q}}:{{output:a}}", bindings={"q": Binding(value="x")})
                manager.submit(cold, SubmitRequest(calls=[spec]))
                cold_call = cold.runs["c0"]
                submitted_at = now()
            await asyncio.sleep(0.005)
        flood_end = now()
        assert cold_call is not None
        await manager.get_variable(cold, "c0~a", timeout_s=30)
        assert cold_call.dispatched_at is not None
        overtaken = sum(
            1
            for c in hot_calls
            if c.dispatched_at is not None and submitted_at < c.dispatched_at < cold_call.dispatched_at
        )
        result.append((cold_call.dispatched_at - submitted_at, cold_call.dispatched_at - flood_end, overtaken))

    run_manager([engine], body, config, virtual=True)
    return result[0]


def test_a_cold_call_ages_past_a_flood_of_cache_hot_calls(default_model_folder: Path) -> None:
    waited, after_flood, overtaken = flood_then_cold(default_model_folder, aging_s=0.5, flood_s=3.0)
    # It ranks behind the hot calls for exactly aging_s, then takes the next free slot: a hot call
    # ends its 10 ms token 10 ms later. The flood had 2.2 s more to go.
    assert [waited, after_flood] == pytest.approx([0.51, -2.195], abs=1e-9)
    assert overtaken == 32


def test_without_aging_the_cold_call_waits_for_the_flood_to_end(default_model_folder: Path) -> None:
    _, after_flood, overtaken = flood_then_cold(default_model_folder, aging_s=0.0, flood_s=2.0)
    # Without aging it waits for the whole flood: the first slot after the flood's last 5 ms tick.
    assert after_flood == pytest.approx(0.005, abs=1e-9)
    assert overtaken == 112
