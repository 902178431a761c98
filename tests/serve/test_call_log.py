"""The request log: one info line per finished call on `parrot.serve.calls`, for semantic calls and
OpenAI-route requests alike, its fields those of the call's run record and the request's usage."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
from live_server import LiveServer

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.serve.runtime.call_log import FORMAT

LOGGER = "parrot.serve.calls"
LINE = re.compile(
    r"call finished: session=(?P<session>\S+) call=(?P<call>\S+) name=(?P<name>\S+) engine=(?P<engine>\S+) "
    r"state=(?P<state>\S+) objective=(?P<objective>\S+) prompt_tokens=(?P<prompt>\d+) computed=(?P<computed>\d+) "
    r"reused=(?P<reused>\d+) output_tokens=(?P<output>\d+) latency_s=(?P<latency>\d+\.\d{3})"
)
SHARED = "A long shared instruction that every question repeats word for word, " * 4


@semantic_function(sampling=SamplingParams(max_tokens=4, ignore_eos=True))
def ask(context: Input, question: Input, answer: Output):  # type: ignore[no-untyped-def]
    """{{input:context}}{{input:question}} -> {{output:answer}}"""


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_one_line_per_semantic_call_with_its_run_records_numbers(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with Session(server.url) as s:
        answers = [ask(SHARED, q) for q in ("one?", "two?")]
        assert all(a.get() for a in answers)
        session = server.manager.sessions.sessions[s.session_id]
        expected = []
        for call_id in ("c0", "c1"):
            run = session.runs[call_id]
            assert run.ready_at is not None and run.finished_at is not None
            expected.append(
                FORMAT
                % (
                    s.session_id,
                    call_id,
                    "ask",
                    "e0",
                    "done",
                    run.objective.value,
                    run.num_prompt_tokens,
                    run.num_prompt_tokens - run.num_cached_tokens,
                    run.num_cached_tokens,
                    4,
                    run.finished_at - run.ready_at,
                )
            )
        reused = sum(session.runs[c].num_cached_tokens for c in ("c0", "c1"))
    assert sorted(lines(caplog)) == sorted(expected)
    assert reused > 0  # one of the two forked the shared instruction the other computed


def test_one_line_per_openai_request_matching_its_usage(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 3, "ignore_eos": True}
    usage = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "ignore_eos": True}
    chat_usage = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    got = [LINE.fullmatch(line) for line in lines(caplog)]
    assert all(m is not None for m in got), lines(caplog)
    fields = [m.groupdict() for m in got if m is not None]
    assert [(f["call"], f["engine"], f["state"], f["objective"]) for f in fields] == [
        ("c0", "e0", "done", "latency")
    ] * 2
    for f, u in zip(fields, (usage, chat_usage), strict=True):
        assert int(f["prompt"]) == u["prompt_tokens"]
        assert int(f["reused"]) == u["prompt_tokens_details"]["cached_tokens"]
        assert int(f["computed"]) == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
        assert int(f["output"]) == u["completion_tokens"]
        assert float(f["latency"]) > 0
    assert fields[0]["session"] != fields[1]["session"]  # a one-call session each


def test_nothing_is_formatted_with_the_logger_off(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Session(server.url) as s:
        assert ask("x", "y").get()
        assert s.status().num_calls_done == 1
    assert lines(caplog) == []
