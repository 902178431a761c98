"""The app benchmark's GPTs warm-up (steady state) and the merge of a partial rerun into a table."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from test_bench_apps import TinyCorpus

from benchmarks.apps.baselines import Completion, Networked
from benchmarks.apps.report import merge_into
from benchmarks.apps.workloads import gpts
from benchmarks.apps.workloads.common import Target
from benchmarks.common.netsim import RttModel
from benchmarks.data import ChatTurn, SystemPrompt
from parrot.text import Tokenizer


class RecordingClient:
    """A request client that answers at once and records each prompt with the time it was sent."""

    name = "recording"

    def __init__(self) -> None:
        self.sent: list[tuple[float, str]] = []

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        self.sent.append((time.monotonic(), prompt))
        await asyncio.sleep(0.01)
        return Completion("x" * max_tokens, max_tokens)

    async def aclose(self) -> None:
        pass


def test_gpts_serves_each_app_once_before_the_clock_starts(tiny_model_folder: Path) -> None:
    """Steady state: each app's system prompt is served (unmeasured) before the first arrival."""

    class Prompts(TinyCorpus):
        def system_prompts(self, n: int, seed: int) -> tuple[SystemPrompt, ...]:
            return tuple(SystemPrompt(f"app{i}", f"You are assistant number {i}. " * 4) for i in range(n))

        def chat_turns(self, n: int, seed: int, max_prompt_tokens: int) -> tuple[ChatTurn, ...]:
            return tuple(ChatTurn(str(i), f"question {i} about rivers", 4, 4) for i in range(n))

    apps = (gpts.App("One", 16, 4, 3), gpts.App("Two", 24, 4, 3))
    params = gpts.Params(apps, rate=50.0, num_requests=4)
    client = RecordingClient()
    sampler = RttModel((0.0,)).sampler("gpts")
    target = Target("a", sampler, client=Networked(client, sampler))  # type: ignore[arg-type]
    outcome = asyncio.run(gpts.run(params, target, Prompts(Tokenizer(tiny_model_folder))))
    assert len(client.sent) == 6 and len(outcome.details["norm_latency_ms"]) == 4
    # The run's output check compares the engine's generated tokens with these: warm-up included.
    assert outcome.num_calls == 6
    assert outcome.num_output_tokens == 6 * 3
    warm, measured = client.sent[:2], client.sent[2:]
    assert all(gpts.WARM_QUERY in prompt for _, prompt in warm)
    assert not any(gpts.WARM_QUERY in prompt for _, prompt in measured)
    assert {prompt.split("User:")[0] for _, prompt in warm} == {p.split("User:")[0] for _, p in measured}
    assert max(t for t, _ in warm) + 0.01 <= min(t for t, _ in measured)


def test_merge_keeps_the_earlier_runs_other_scenarios() -> None:
    earlier = {
        "machine": {"commit": "abc"},
        "scenarios": [{"key": "chain"}, {"key": "gpts/rate2"}],
        "records": [{"scenario": "chain", "config": "a"}, {"scenario": "gpts/rate2", "config": "a", "error": "x"}],
    }
    now = {"scenarios": [{"key": "gpts/rate2"}], "records": [{"scenario": "gpts/rate2", "config": "a"}]}
    merge_into(now, earlier)
    assert [s["key"] for s in now["scenarios"]] == ["chain", "gpts/rate2"]
    assert now["records"] == [{"scenario": "chain", "config": "a"}, {"scenario": "gpts/rate2", "config": "a"}]
    assert now["merged_from"] == {"commit": "abc", "scenarios": ["chain"]}
