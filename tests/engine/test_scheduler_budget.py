"""The step's token budget: the latency cap holds while latency-critical work decodes; while it
only prefills, steps take `latency_prefill_tokens` (scheduler unit tests, no model)."""

from __future__ import annotations

import pytest
from sched_harness import Harness

from parrot.engine.config import EngineConfig
from parrot.protocol.objective import Objective

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT


def test_a_lone_latency_prefill_takes_prefill_sized_steps() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("a", LAT, 1300)
    h.generate("a", LAT)  # queued behind its fill: not decoding yet
    assert h.plan_tokens() == [512]


@pytest.mark.parametrize(
    ("decode_objective", "expected"),
    [(LAT, [1, 127]), (TPUT, [1, 511])],  # the decode's one token, then as much of the prompt as allowed
)
def test_only_a_latency_critical_decode_caps_the_step(decode_objective: Objective, expected: list[int]) -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.computed("d", 40)
    h.generate("d", decode_objective)
    h.fill("p", LAT, 1300)
    assert h.plan_tokens() == expected


def test_a_fork_generate_ready_to_decode_counts_as_decoding() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.computed("parent", 40)
    h.generate("child", LAT, fork_from="parent")  # forks from a computed parent: decodes at once
    h.fill("p", LAT, 1300)
    assert h.plan_tokens() == [1, 127]


def test_a_fork_of_a_parent_still_filling_is_not_decoding() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("parent", LAT, 1300)
    h.generate("child", LAT, fork_from="parent")
    assert h.plan_tokens() == [512]


@pytest.mark.parametrize(
    ("prefill_tokens", "cap", "expected"),
    [(None, 128, 128), (64, 128, 128), (4096, 128, 2048)],  # off; never below the cap; never above the budget
)
def test_prefill_budget_bounds(prefill_tokens: int | None, cap: int, expected: int) -> None:
    h = Harness(latency_max_batched_tokens=cap, latency_prefill_tokens=prefill_tokens)
    h.fill("a", LAT, 3000)
    assert h.plan_tokens() == [expected]


def test_without_latency_work_the_whole_budget_is_used() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("a", TPUT, 3000)
    assert h.plan_tokens() == [2048]


def test_config_rejects_a_non_positive_prefill_budget() -> None:
    with pytest.raises(ValueError, match="latency_prefill_tokens"):
        EngineConfig(latency_prefill_tokens=0)


def test_a_prompts_short_rest_joins_its_last_chunk_in_a_step_without_decodes() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("a", LAT, 1057)  # 1,056 tokens to compute: 512 + 544, not 512 + 512 + 32
    assert [h.step() for _ in range(2)] == [{"a": 512}, {"a": 544}]
    assert not h.scheduler.has_work()
    h.fill("b", LAT, 1200)  # a rest of 175 > 512 / 8 beyond the budget: chunked as before
    assert [h.step() for _ in range(3)] == [{"b": 512}, {"b": 512}, {"b": 175}]


def test_the_rest_of_a_prompt_never_exceeds_the_engines_step_limit() -> None:
    h = Harness()  # no latency work: the whole 2,048-token budget, and no room above it
    h.fill("a", TPUT, 2060)
    assert [h.step() for _ in range(2)] == [{"a": 2048}, {"a": 11}]


def test_no_slack_in_a_step_with_a_decode() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.computed("d", 40)
    h.generate("d", TPUT)  # a throughput decode: the budget is 512, and the step decodes
    h.fill("p", LAT, 540)  # 539 to compute: 511 beside the decode, then the rest
    assert h.plan_tokens() == [1, 511]
