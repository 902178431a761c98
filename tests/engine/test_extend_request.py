"""An Extend: tokens in, then (with sampling) a generation, as one request and one step fewer; the
rules of the request and of its stream."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from parrot.engine import sync_client
from parrot.protocol import ExtendRequest, Filled, FreeContextRequest, SamplingParams
from parrot.protocol.errors import ParrotError
from tests.engine.test_engine_correctness import GREEDY, gen, make_engine, prompt


def test_tokens_and_sampling_are_fill_then_generate_in_one_step_fewer(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder, block_size=16)
    try:
        p, suffix = prompt(7, 40), prompt(8, 9)
        steps0 = engine.stats().num_steps
        sync_client.extend_only(engine, ExtendRequest(context_id="apart", token_ids=p))
        apart = gen(engine, "apart")
        steps_apart = engine.stats().num_steps - steps0
        assert steps_apart == GREEDY.max_tokens + 1

        # Create: the fill's last token and the first sample share a step.
        before = engine.stats()
        events = sync_client.extend(engine, ExtendRequest(context_id="one", token_ids=p, sampling=GREEDY))
        after = engine.stats()
        assert sync_client.token_ids(events) == apart
        assert after.num_steps - before.num_steps == steps_apart - 1
        assert after.num_prefill_tokens - before.num_prefill_tokens == 40
        assert after.num_decode_tokens - before.num_decode_tokens == GREEDY.max_tokens
        assert engine.context_info("one").num_tokens == 40 + GREEDY.max_tokens
        # The first event says what the tokens did (the 40th token is the generation's); no other does.
        assert events[0].filled == Filled(num_tokens=40, num_filled_tokens=39)
        assert [e.filled for e in events[1:]] == [None] * (GREEDY.max_tokens - 1)

        # Fork: a parent's prefix, then the suffix and the generation in one request.
        sync_client.extend_only(engine, ExtendRequest(context_id="base", token_ids=p))
        sync_client.extend_only(engine, ExtendRequest(context_id="f_apart", token_ids=suffix, parent_context_id="base"))
        steps0 = engine.stats().num_steps
        fork_apart = gen(engine, "f_apart")
        steps_fork_apart = engine.stats().num_steps - steps0 + 1  # the fill's own step
        before = engine.stats()
        req = ExtendRequest(context_id="f_one", parent_context_id="base", token_ids=suffix, sampling=GREEDY)
        events = sync_client.extend(engine, req)
        after = engine.stats()
        assert sync_client.token_ids(events) == fork_apart
        assert events[0].filled == Filled(num_tokens=49, num_filled_tokens=9)  # the parent's last token, 8 of ours
        assert after.num_steps - before.num_steps == steps_fork_apart - 1 == GREEDY.max_tokens
        assert after.num_reused_tokens - before.num_reused_tokens == 39  # the parent's computed tokens
        info = engine.context_info("f_one")
        assert [info.parent_context_id, info.num_tokens] == ["base", 49 + GREEDY.max_tokens]

        # Append: more tokens to an existing context, then generate.
        sync_client.extend_only(engine, ExtendRequest(context_id="a_apart", token_ids=p))
        sync_client.extend_only(engine, ExtendRequest(context_id="a_apart", token_ids=suffix, append=True))
        append_apart = gen(engine, "a_apart")
        sync_client.extend_only(engine, ExtendRequest(context_id="a_one", token_ids=p))
        before = engine.stats()
        req = ExtendRequest(context_id="a_one", token_ids=suffix, append=True, sampling=GREEDY)
        assert sync_client.token_ids(sync_client.extend(engine, req)) == append_apart
        assert engine.stats().num_steps - before.num_steps == GREEDY.max_tokens

        # No tokens: a plain generation; its events carry no `filled`.
        events = sync_client.extend(engine, ExtendRequest(context_id="a_one", append=True, sampling=GREEDY))
        assert [e.filled for e in events] == [None] * GREEDY.max_tokens
        for cid in ["apart", "one", "f_apart", "f_one", "base", "a_apart", "a_one"]:
            engine.free(FreeContextRequest(context_id=cid))
        assert engine.stats().num_contexts == 0
    finally:
        engine.stop()


def test_an_extend_without_sampling_streams_exactly_one_filled_event(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder, block_size=16)
    try:
        events = sync_client.extend(engine, ExtendRequest(context_id="c", token_ids=prompt(1, 30)))
        assert len(events) == 1
        assert [events[0].token_id, events[0].text, events[0].finish_reason] == [None, "", "filled"]
        assert events[0].filled == Filled(num_tokens=30, num_filled_tokens=29)  # the last waits for a generation
        events = sync_client.extend(engine, ExtendRequest(context_id="c", token_ids=prompt(2, 5), append=True))
        assert [(e.finish_reason, e.filled) for e in events] == [("filled", Filled(num_tokens=35, num_filled_tokens=5))]
        # A fork without tokens is a fork: it computes nothing.
        events = sync_client.extend(engine, ExtendRequest(context_id="k", parent_context_id="c"))
        assert [(e.finish_reason, e.filled) for e in events] == [("filled", Filled(num_tokens=35, num_filled_tokens=0))]
        assert engine.context_info("k").parent_context_id == "c"
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [
        ({"context_id": "held", "token_ids": [5]}, 409, "context_id"),  # creating an existing id
        ({"context_id": "nope", "token_ids": [5], "append": True}, 404, "context_id"),
        ({"context_id": "nope", "token_ids": [], "append": True}, 404, "context_id"),  # a plain generation
        ({"context_id": "held", "token_ids": [], "parent_context_id": "gone"}, 409, "context_id"),  # a fork's new id
        ({"context_id": "new", "token_ids": [], "parent_context_id": "gone"}, 404, "parent_context_id"),
        ({"context_id": "new", "token_ids": [5], "parent_context_id": "gone"}, 404, "parent_context_id"),
        ({"context_id": "new", "token_ids": [10**9]}, 400, "token_ids"),  # outside the vocabulary
        ({"context_id": "held", "token_ids": "too long", "append": True}, 400, "token_ids"),
    ],
)
def test_a_bad_extend_is_refused_before_anything_is_queued(
    tiny_model_folder: Path, fields: dict[str, object], status: int, field: str
) -> None:
    engine = make_engine(tiny_model_folder)
    try:
        if fields["token_ids"] == "too long":  # 10 held + the model's limit
            fields = {**fields, "token_ids": [5] * engine.max_model_len}
        sync_client.extend_only(engine, ExtendRequest(context_id="held", token_ids=prompt(1, 10)))
        before = engine.stats()
        with pytest.raises(ParrotError) as e:
            sync_client.submit(engine, ExtendRequest(sampling=GREEDY, **fields))  # type: ignore[arg-type]
        assert [e.value.status, e.value.field] == [status, field]
        after = engine.stats()
        assert [after.num_contexts, after.num_waiting, after.num_running] == [1, 0, 0]
        assert after.num_steps == before.num_steps
        assert engine.context_info("held").num_tokens == 10
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"context_id": "c"}, "token_ids", "needs token_ids, sampling or a parent_context_id"),
        ({"context_id": "c", "append": True}, "token_ids", "needs token_ids, sampling or a parent_context_id"),
        ({"context_id": "c", "sampling": SamplingParams()}, "token_ids", "nothing to generate from"),
        (
            {"context_id": "c", "token_ids": [1], "score": True, "sampling": SamplingParams()},
            "score",
            "without sampling",
        ),
        (
            {"context_id": "c", "token_ids": [1], "top_logprobs": 2, "sampling": SamplingParams()},
            "top_logprobs",
            "without sampling",
        ),
        ({"context_id": "c", "token_ids": [1], "append": True, "parent_context_id": "p"}, "append", "names no parent"),
    ],
)
def test_a_request_that_says_nothing_coherent_is_refused_by_the_message(
    fields: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as e:
        ExtendRequest(**fields)  # type: ignore[arg-type]
    [error] = e.value.errors()
    assert [error["loc"], message in error["msg"]] == [(field,), True]


def test_a_fill_that_fails_at_run_time_ends_the_generation_with_its_error(
    tiny_model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_model_folder)
    engine.stop()  # drive the steps here
    handle = sync_client.submit(engine, ExtendRequest(context_id="c", token_ids=prompt(2, 20), sampling=GREEDY))

    def boom(seqs: object, interrupt: object = None) -> object:
        raise RuntimeError("injected")

    monkeypatch.setattr(engine.runner, "run", boom)
    assert engine.step()
    with pytest.raises(ParrotError) as e:
        sync_client.wait(handle, timeout=5)
    assert e.value.status == 500 and "injected" in e.value.message
    assert handle.events.empty()  # one terminal event, nothing after it
    assert not engine.step()  # nothing left queued
    stats = engine.stats()
    assert [stats.num_waiting, stats.num_running] == [0, 0]
    engine.free(FreeContextRequest(context_id="c"))


def test_stopping_with_a_generating_extend_queued_ends_its_generation_once(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    engine.stop()
    handle = sync_client.submit(engine, ExtendRequest(context_id="c", token_ids=prompt(3, 20), sampling=GREEDY))
    engine.stop()  # fails what is queued: the fill, whose error ends the generation
    with pytest.raises(ParrotError) as e:
        sync_client.wait(handle, timeout=5)
    assert e.value.status == 503
    assert handle.events.empty()  # one terminal event, not a second "engine stopped"
