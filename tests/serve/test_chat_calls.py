"""Chat-form calls through the manager, with the default model's tokenizer (its ChatML template):
the engine gets the tokenizer's ids for the chat-template-rendered prompt with the values filled in,
prefix points sit where a hand-written template's do, and bad messages are 400s naming the field."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from manager_harness import new_session, run_manager
from test_exact_tokens import ODD_VALUES, PromptRecorder

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, ChatMessage, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import ManagerConfig
from parrot.serve.manager import Manager
from parrot.serve.runtime.contexts import prompt_points
from parrot.text import Tokenizer

SYSTEM = "Answer questions about this document.\n"
MESSAGES = [
    ChatMessage(role="system", content=SYSTEM + "{{input:doc}}"),
    ChatMessage(role="user", content="{{input:q}}"),
]
SAMPLING = SamplingParams(max_tokens=2)


def expected_ids(tok: Tokenizer, doc: str, q: str, reply_start: str) -> list[int]:
    """The oracle: the model's chat template over the filled messages. A reply that starts with text
    continues the final assistant message (Hugging Face's `continue_final_message`: cut after its
    content); an empty one is the generation prompt."""
    filled = [{"role": "system", "content": SYSTEM + doc}, {"role": "user", "content": q}]
    if not reply_start:
        return tok.encode(tok.apply_chat_template(filled, add_generation_prompt=True))
    text = tok.apply_chat_template([*filled, {"role": "assistant", "content": reply_start}], False)
    return tok.encode(text[: text.rindex(reply_start) + len(reply_start)])


@pytest.mark.parametrize("reply_start", ["", "Answer:", "Answer: "])
def test_the_engine_gets_the_tokenizers_ids_for_the_chat_template_rendered_prompt(
    default_model_folder: Path, reply_start: str
) -> None:
    """Odd values (spaces, newlines, special-token text, non-ASCII), half set after submit (the
    ready prefix filled early, then the rest)."""
    engine = PromptRecorder(default_model_folder, max_model_len=8192)
    tok = engine.tokenizer
    pairs = [(ODD_VALUES[i], ODD_VALUES[-1 - i]) for i in range(len(ODD_VALUES))]
    messages = [*MESSAGES, ChatMessage(role="assistant", content=reply_start + "{{output:a}}")]

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        variables, calls = [], []
        for i, (doc, q) in enumerate(pairs):
            variables.append(VariableSpec(var_id=f"d{i}", value=doc))
            variables.append(VariableSpec(var_id=f"q{i}", value=None if i % 2 else q))
            bindings = {"doc": Binding(var_id=f"d{i}"), "q": Binding(var_id=f"q{i}")}
            calls.append(CallSpec(messages=messages, bindings=bindings, default_sampling=SAMPLING))
        manager.submit(session, SubmitRequest(variables=variables, calls=calls))
        await asyncio.sleep(0.05)
        for i, (_, q) in enumerate(pairs):
            if i % 2:
                manager.set_variable(session, f"q{i}", q)
        for i in range(len(pairs)):
            await manager.get_variable(session, f"c{i}~a")

    run_manager([engine], body, ManagerConfig())
    for i, (doc, q) in enumerate(pairs):
        assert engine.prompts[f"c{i}"] == [expected_ids(tok, doc, q, reply_start)], (doc, q)


def test_prefix_points_sit_at_the_variable_boundaries_of_the_rendered_chat(default_model_folder: Path) -> None:
    """A chat call's points are those of the same prompt written by hand as a ChatML template, and
    calls over one document share it: the point at the document's end is the tokenizer's count."""
    engine = FakeEngine(default_model_folder, max_model_len=8192)
    tok = engine.tokenizer
    doc = "The museum reopens in May after two years of repairs to its roof and its west wing. " * 3
    by_hand = (
        "<|im_start|>system\n" + SYSTEM + "{{input:doc}}<|im_end|>\n<|im_start|>user\n{{input:q}}<|im_end|>\n"
        "<|im_start|>assistant\n{{output:a}}"
    )
    messages = [*MESSAGES, ChatMessage(role="assistant", content="{{output:a}}")]
    got: dict[str, object] = {}

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        bind = [{"doc": Binding(var_id="doc"), "q": Binding(value=q)} for q in ("When?", "Why is it shut?")]
        calls = [CallSpec(messages=messages, bindings=b, default_sampling=SAMPLING) for b in bind]
        manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="doc", value=doc)], calls=calls))
        for c in ("c0", "c1"):
            await manager.get_variable(session, f"{c}~a")
        got["reused"] = [session.runs[c].num_cached_tokens for c in ("c0", "c1")]
        hand_written = CallSpec(template=by_hand, bindings=bind[0], default_sampling=SAMPLING)
        manager.submit(session, SubmitRequest(calls=[hand_written]))
        nodes = session.graph.calls
        stop = nodes["c0"].template.first_output_index
        got["points"] = {c: prompt_points(nodes[c], session.graph.variables, tok, stop, 64) for c in nodes}
        await manager.get_variable(session, "c2~a")

    run_manager([engine], body, ManagerConfig())
    points = got["points"]
    assert isinstance(points, dict)
    assert points["c0"] == points["c2"]  # token ids and points: as the hand-written template's
    prefix_ids = tok.encode("<|im_start|>system\n" + SYSTEM + doc)
    ids, c0_points = points["c0"]
    assert ids[: len(prefix_ids)] == prefix_ids
    at_doc_end = next(p for p in c0_points if p.num_tokens == len(prefix_ids))
    assert at_doc_end in points["c1"][1]  # the same hash in the call with another question
    # One of them forked the longest prefix both share (the document and the user's turn header) that
    # the other computed: all of it but its last token, which the fork computes itself.
    shared = max(p.num_tokens for p in c0_points if p in points["c1"][1])
    assert shared > len(prefix_ids)
    assert sorted(got["reused"]) == [0, shared - 1]


def test_bad_messages_are_400_naming_the_field(default_model_folder: Path) -> None:
    engine = FakeEngine(default_model_folder)

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        bad = [ChatMessage(role="user", content="Hi {{output:a}}")]
        with pytest.raises(ParrotError) as info:
            manager.submit(session, SubmitRequest(calls=[CallSpec(messages=bad)]))
        assert (info.value.status, info.value.field) == (400, "calls[0].messages[0].content")
        # The same list again: a cached rendering never hides the error's field.
        ok = [ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="{{output:a}}")]
        calls = [CallSpec(messages=ok, default_sampling=SAMPLING), CallSpec(messages=bad)]
        with pytest.raises(ParrotError) as info:
            manager.submit(session, SubmitRequest(calls=calls))
        assert info.value.field == "calls[1].messages[0].content"
        assert manager.status(session).num_calls == 0

    run_manager([engine], body, ManagerConfig())
