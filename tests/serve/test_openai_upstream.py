"""The adapter's dialect, on hand-written chunks: vLLM's and Parrot's streamed choices become engine
events (ids, logprobs, text, EOS vs stop), with the re-tokenizing fallback; error bodies keep
their status and message; request bodies carry only the settings that say something."""

from __future__ import annotations

from typing import Any

import pytest

from parrot.backends.openai_dialect import (
    StopRule,
    choice_events,
    completion_body,
    refuses_field,
    refuses_priority,
    upstream_error,
    upstream_priority,
    with_logprobs_ids,
)
from parrot.backends.tpot_profile import TpotProfile, bucket_of
from parrot.protocol.engine_api import TokenEvent
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.protocol.sampling import SamplingParams

RULE = StopRule(eos_ids=frozenset({2}), ignore_eos=False)
UNKNOWN_EOS = StopRule(eos_ids=frozenset(), ignore_eos=False)


def vllm(text: str, ids: list[int], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A streamed choice as vLLM sends it with logprobs=0 and return_tokens_as_token_ids."""
    tokens = [f"token_id:{t}" for t in ids]
    logprobs = {"tokens": tokens, "token_logprobs": [-0.5] * len(ids), "top_logprobs": [], "text_offset": []}
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish} | extra


def by_length(text: str) -> list[int]:
    return [len(text)]  # a stand-in tokenizer: one token whose id is the text's length


def test_token_ids_come_with_their_logprobs_and_the_text_on_the_last() -> None:
    assert choice_events(vllm("ab", [7, 8]), None, RULE) == [
        TokenEvent(token_id=7, logprob=-0.5),
        TokenEvent(token_id=8, logprob=-0.5, text="ab"),
    ]
    # vLLM's `token_ids` field (return_token_ids) is read too.
    assert choice_events({"text": "x", "token_ids": [5], "finish_reason": None}, None, RULE) == [
        TokenEvent(token_id=5, text="x")
    ]


def test_eos_is_told_from_a_stop_by_the_token_or_by_vllms_stop_reason() -> None:
    assert choice_events(vllm("", [2], "stop"), None, RULE)[-1].finish_reason == "eos"
    assert choice_events(vllm("", [9], "stop"), None, RULE)[-1].finish_reason == "stop"
    ignoring = StopRule(eos_ids=frozenset({2}), ignore_eos=True)
    assert choice_events(vllm("", [2], "stop"), None, ignoring)[-1].finish_reason == "stop"
    # Without a tokenizer's EOS ids: vLLM's stop_reason is None for an EOS, the stop otherwise.
    cases = [({"stop_reason": None}, "eos"), ({"stop_reason": "###"}, "stop"), ({"stop_reason": 9}, "stop")]
    for extra, reason in [*cases, ({}, "stop")]:
        assert choice_events(vllm("", [9], "stop", **extra), None, UNKNOWN_EOS)[-1].finish_reason == reason, extra


def test_a_finish_or_text_without_tokens_is_a_token_less_event() -> None:
    assert choice_events(vllm("", [], "length"), None, RULE) == [TokenEvent(token_id=None, finish_reason="length")]
    assert choice_events(vllm("held", []), None, RULE) == [TokenEvent(token_id=None, text="held")]
    assert choice_events(vllm("", []), None, RULE) == []
    assert choice_events(vllm("", [4], "abort"), None, RULE)[-1].finish_reason == "aborted"
    odd = choice_events(vllm("", [4], "repetition"), None, RULE)[-1]
    assert [odd.token_id, odd.finish_reason, odd.error] == [4, "error", "upstream finish_reason 'repetition'"]


def test_without_ids_the_text_is_retokenized() -> None:
    plain = {"index": 0, "text": "Hello", "logprobs": None, "finish_reason": None}
    assert choice_events(plain, by_length, RULE) == [TokenEvent(token_id=5, text="Hello")]
    as_text = plain | {"logprobs": {"tokens": ["Hel", "lo"], "token_logprobs": [-1.0, -2.0]}}
    assert choice_events(as_text, by_length, RULE) == [TokenEvent(token_id=5, text="Hello")]
    assert choice_events(plain | {"text": ""}, None, RULE) == []
    with pytest.raises(ParrotError) as info:
        choice_events(plain, None, RULE)
    assert [info.value.status, info.value.field] == [502, "tokenizer"]


def test_upstream_errors_keep_status_and_message() -> None:
    bodies = {
        '{"error": {"message": "bad prompt", "type": "BadRequestError", "param": "prompt", "code": 400}}': (
            "upstream http://u answered 400 (its field 'prompt'): bad prompt"
        ),
        '{"object": "error", "message": "old shape", "type": "BadRequestError", "code": 400}': (
            "upstream http://u answered 400: old shape"
        ),
        '{"error": {"message": "unknown model", "field": "model", "status": 400}}': (
            "upstream http://u answered 400 (its field 'model'): unknown model"
        ),
        "Bad Gateway": "upstream http://u answered 400: Bad Gateway",
    }
    for body, message in bodies.items():
        error = upstream_error("http://u", 400, body)
        assert [error.status, error.message, error.field] == [400, message, None]


def test_request_bodies_send_extensions_only_when_they_say_something() -> None:
    plain = completion_body("m", [1, 2], SamplingParams(), 5, ask_token_ids=False)
    assert plain == {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sampling = SamplingParams(temperature=0.7, seed=3, stop=["##"], top_k=5, stop_token_ids=[9], ignore_eos=True)
    full = completion_body("m", [1], sampling, 4, ask_token_ids=True)
    assert {k: v for k, v in full.items() if k not in plain or plain[k] != v} == {
        "prompt": [1],
        "max_tokens": 4,
        "temperature": 0.7,
        "seed": 3,
        "stop": ["##"],
        "top_k": 5,
        "stop_token_ids": [9],
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }


def test_token_ids_come_without_logprobs_unless_someone_reads_them() -> None:
    quiet = completion_body("m", [1], SamplingParams(), 4, ask_token_ids=True, logprobs=False)
    assert [quiet.get("return_token_ids"), "logprobs" in quiet, "return_tokens_as_token_ids" in quiet] == [
        True,
        False,
        False,
    ]
    tops = completion_body("m", [1], SamplingParams(top_logprobs=2), 4, ask_token_ids=True, logprobs=False)
    assert [tops["logprobs"], tops["return_tokens_as_token_ids"], "return_token_ids" in tops] == [2, True, False]
    plain = completion_body("m", [1], SamplingParams(), 4, ask_token_ids=False, logprobs=False)
    assert not {"logprobs", "return_token_ids", "return_tokens_as_token_ids"} & set(plain)
    # An upstream that does not know the field (Parrot's own forbids extra fields) is asked the old way.
    refusal = '{"error": {"message": "return_token_ids: Extra inputs are not permitted"}}'
    assert [refuses_field("return_token_ids", quiet, 422, refusal), refuses_field("priority", quiet, 422, refusal)] == [
        True,
        False,
    ]
    assert with_logprobs_ids(quiet) == {k: v for k, v in quiet.items() if k != "return_token_ids"} | {
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }


def test_a_priority_is_sent_only_when_it_says_something() -> None:
    assert "priority" not in completion_body("m", [1], SamplingParams(), 4, ask_token_ids=False, priority=0)
    assert completion_body("m", [1], SamplingParams(), 4, ask_token_ids=False, priority=2000)["priority"] == 2000
    # Latency-critical first, then the higher Parrot priority (vLLM serves smaller values first).
    order = [
        upstream_priority(Objective.LATENCY, 1),
        upstream_priority(Objective.LATENCY, 0),
        upstream_priority(Objective.LATENCY, -1000),
        upstream_priority(Objective.THROUGHPUT, 1000),
        upstream_priority(Objective.THROUGHPUT, 0),
    ]
    assert order == [-1, 0, 1000, 1001, 2001]
    vllm_fcfs = "Got priority 2001 but Priority scheduling is not enabled."
    parrot_extra = '{"error": {"message": "priority: Extra inputs are not permitted", "field": "priority"}}'
    with_field = {"priority": 2001}
    cases = [
        refuses_priority(with_field, 400, vllm_fcfs),
        refuses_priority(with_field, 422, parrot_extra),
        refuses_priority({}, 400, vllm_fcfs),
        refuses_priority(with_field, 500, vllm_fcfs),
        refuses_priority(with_field, 400, "bad prompt"),
    ]
    assert cases == [True, True, False, False, False]


def test_the_step_profile_is_the_median_gap_by_concurrent_streams() -> None:
    profile = TpotProfile(window=4)
    assert [bucket_of(1), bucket_of(2), bucket_of(3), bucket_of(4), bucket_of(5), bucket_of(0)] == [1, 2, 4, 4, 8, 1]
    for gap in (20.0, 22.0, 500.0):  # a gap that held another request's prefill is an outlier
        profile.observe(1, gap)
    profile.observe(3, 90.0, num_tokens=3)  # a chunk of three tokens: 30 ms each
    profile.observe(4, 40.0)
    profile.observe(4, 0.0, num_tokens=0)  # nothing arrived: nothing learned
    assert profile.as_dict() == {1: 22.0, 4: 30.0}
    for gap in (10.0, 10.0, 10.0, 10.0):  # the window keeps the recent gaps only
        profile.observe(1, gap)
    assert profile.as_dict() == {1: 10.0, 4: 30.0}
