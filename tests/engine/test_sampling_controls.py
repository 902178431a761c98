"""Constrained output (regex, JSON schema, choices), top logprobs, logit bias and penalties in the
builtin engine (tiny random LLaMA, fp32): outputs obey the constraint, adjustments are exact, and
a request's tokens do not depend on the adjusted requests batched with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.logits import adjust, observe, start_history
from parrot.engine.sampler import SampleRow
from parrot.protocol import ExtendRequest, SamplingParams
from parrot.protocol.errors import ParrotError

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 30]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_model_folder: Path) -> object:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=2048))
    engine.start()
    yield engine
    engine.stop()


def run(engine: LLMEngine, ctx: str, sampling: SamplingParams, prompt: list[int] | None = None):  # type: ignore[no-untyped-def]
    req = ExtendRequest(context_id=ctx, token_ids=prompt or [5, 6, 7, 8], sampling=sampling)
    return sync_client.extend(engine, req)


def text(events: list) -> str:  # type: ignore[type-arg]
    return "".join(e.text for e in events)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_json_schema_output_parses_and_validates(engine: LLMEngine, seed: int | None) -> None:
    temperature = 0.0 if seed is None else 1.0
    events = run(
        engine, f"js{seed}", SamplingParams(max_tokens=64, json_schema=SCHEMA, temperature=temperature, seed=seed)
    )
    value = json.loads(text(events))
    assert sorted(value) == ["n", "ok"]
    assert isinstance(value["ok"], bool)
    assert value["n"] in [1, 2, 30]
    assert events[-1].finish_reason == "eos"


def test_regex_output_matches(engine: LLMEngine) -> None:
    events = run(engine, "re", SamplingParams(max_tokens=32, regex=r"[ab]{3}-[0-9]{2}", temperature=1.0, seed=7))
    assert re.fullmatch(r"[ab]{3}-[0-9]{2}", text(events)), text(events)
    assert events[-1].finish_reason == "eos"


def test_choices_pick_exactly_one_and_report_its_score(engine: LLMEngine) -> None:
    choices = ["yes", "no", "maybe not"]
    events = run(engine, "ch", SamplingParams(max_tokens=16, choices=choices))
    out = text(events)
    assert out in choices
    assert events[-1].choice_logprobs == {out: pytest.approx(sum(e.logprob for e in events))}


def test_top_logprobs_are_sorted_and_hold_the_greedy_token(engine: LLMEngine) -> None:
    events = run(engine, "top", SamplingParams(max_tokens=4, ignore_eos=True, top_logprobs=5))
    for e in events:
        assert e.top_logprobs is not None and len(e.top_logprobs) == 5
        assert e.top_logprobs[0].token_id == e.token_id
        assert e.top_logprobs[0].logprob == e.logprob
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)


def test_logit_bias_forces_a_token(engine: LLMEngine) -> None:
    events = run(engine, "bias", SamplingParams(max_tokens=5, ignore_eos=True, logit_bias={1234: 100.0}))
    assert sync_client.token_ids(events) == [1234] * 5


def batch(engine: LLMEngine, tag: str, params: list[SamplingParams]) -> list:  # type: ignore[type-arg]
    """All queued before the first step (the engine's loop is stopped), then stepped to the end."""
    handles = [
        sync_client.submit(engine, ExtendRequest(context_id=f"{tag}{i}", token_ids=[9, 10, 11], sampling=p))
        for i, p in enumerate(params)
    ]
    while engine.step():
        pass
    return [sync_client.wait(h) for h in handles]


def test_a_request_does_not_depend_on_adjusted_neighbours(tiny_model_folder: Path) -> None:
    """Same batch shape (so the same forward pass), neighbours plain or adjusted: the first
    request's tokens, logprobs and alternatives are bit-equal."""
    plain = SamplingParams(max_tokens=8, ignore_eos=True, top_logprobs=2)
    others = [
        SamplingParams(max_tokens=8, json_schema=SCHEMA, temperature=1.0, seed=5),
        SamplingParams(max_tokens=8, ignore_eos=True, frequency_penalty=1.5, repetition_penalty=1.3),
        SamplingParams(max_tokens=8, ignore_eos=True, logit_bias={77: 3.0}, temperature=1.0, seed=3),
    ]
    neutral = [SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=5)] + [
        p.model_copy(
            update={"json_schema": None, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {}}
        )
        for p in others[1:]
    ]
    engine = LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=512))
    base = batch(engine, "base", [plain, *neutral])[0]
    mixed = batch(engine, "mixed", [plain, *others])[0]
    assert [e.token_id for e in mixed] == [e.token_id for e in base]
    assert [e.logprob for e in mixed] == [e.logprob for e in base]
    assert [e.top_logprobs for e in mixed] == [e.top_logprobs for e in base]


def test_bad_constraints_are_400s_naming_the_field(engine: LLMEngine) -> None:
    with pytest.raises(ParrotError) as bad_regex:
        run(engine, "bad1", SamplingParams(regex="(unclosed"))
    assert [bad_regex.value.status, bad_regex.value.field] == [400, "sampling.regex"]
    with pytest.raises(ParrotError) as bad_bias:
        run(engine, "bad2", SamplingParams(logit_bias={10**6: 1.0}))
    assert [bad_bias.value.status, bad_bias.value.field] == [400, "sampling.logit_bias"]
    with pytest.raises(ValueError, match="at most one of regex, json_schema and choices"):
        SamplingParams(regex="a", choices=["a"])


def test_penalties_and_bias_are_exact() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0, logit_bias={3: 1.0})
    row = SampleRow(params, None)
    start_history(row, [1], 5)  # the prompt holds token 1
    for token in [2, 2, 4]:
        observe(row, token, -1.0, 5)
    logits = torch.tensor([[1.0, 4.0, 2.0, -1.0, -2.0]])
    adjust(logits, [row])
    # token 1: seen -> 4/2; token 2: seen, twice -> 2/2 - 0.5 - 0.5; token 3: +1 bias;
    # token 4: seen, negative, once -> -2*2 - 0.5 - 0.25.
    assert logits.tolist() == [[1.0, 2.0, 0.0, 0.0, -4.75]]
    assert row.logprob_sum == -3.0
