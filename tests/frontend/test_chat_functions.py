"""Chat-form semantic functions in the SDK: roles from a docstring or a message list, sent as
messages (never rendered here), run end to end on the tiny engine."""

from __future__ import annotations

import pytest
from live_server import LiveServer

from parrot.frontend import (
    ChatMessage,
    Input,
    Output,
    SamplingParams,
    SemanticFunction,
    Session,
    assistant,
    semantic_function,
    system,
    user,
)
from parrot.frontend.chat import docstring_messages
from parrot.protocol.errors import ParrotError
from parrot.protocol.template import Placeholder, TextPiece

SHORT = SamplingParams(max_tokens=3, ignore_eos=True)


@semantic_function(chat=True, sampling=SHORT)
def answer(document: Input, question: Input, answer: Output):  # type: ignore[no-untyped-def]
    """system: Answer questions about this document.
    {{input:document}}
    user: {{input:question}}
    assistant: {{output:answer}}"""


def test_a_chat_docstring_becomes_messages() -> None:
    assert answer.messages == [
        system("Answer questions about this document.\n{{input:document}}"),
        user("{{input:question}}"),
        assistant("{{output:answer}}"),
    ]
    assert answer.template is None
    assert (answer.inputs, answer.outputs) == (["document", "question"], ["answer"])
    text = "system:\n  Be brief.\n\nuser: Hi\nthere\nassistant:Sure: {{output:a}}"
    assert docstring_messages(text, "f") == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi\nthere"),
        ChatMessage(role="assistant", content="Sure: {{output:a}}"),
    ]


def test_bad_chat_declarations_name_the_field() -> None:
    with pytest.raises(ParrotError) as info:
        docstring_messages("Hello\nuser: hi", "f.__doc__")
    assert (info.value.field, info.value.message) == (
        "f.__doc__",
        "f.__doc__: a chat docstring starts with a role line (system:, user: or assistant:)",
    )
    with pytest.raises(ParrotError) as info:
        SemanticFunction("f", [("user", "{{input:x}}"), ("narrator", "{{output:y}}")], ["x"], {"y": None})
    assert info.value.field == "f.messages[1]"
    with pytest.raises(ParrotError) as info:
        SemanticFunction("f", [user("{{input:x}} {{output:y}}")], ["x"], {"y": None})
    assert (info.value.field, info.value.message) == (
        "f.messages[0].content",
        "output 'y' in a user message: only the assistant's are generated",
    )


def test_chat_calls_run_and_are_sent_as_messages(server: LiveServer) -> None:
    # A message list as the template, (role, text) pairs allowed; an input mixing text and a variable.
    combine = SemanticFunction(
        "combine",
        [("system", "Merge the notes."), user("Notes: {{input:notes}}"), assistant("Merged:{{output:merged}}")],
        inputs=["notes"],
        outputs={"merged": SHORT},
    )
    with Session(server.url) as s:
        doc = s.variable("doc", "The museum reopens in May. " * 4)
        first, second = answer(doc, "When?"), answer(doc, "Why?")
        merged = combine(f"{first} / {second}")  # two variables inside text: expanded, not rendered
        assert len(merged.get()) > 0
        session = server.manager.sessions.sessions[s.session_id]
        pieces = session.graph.calls["c2"].template.pieces
        status = s.status()
    assert [p.name for p in pieces if isinstance(p, Placeholder)] == ["notes__0", "notes__2", "merged"]
    assert pieces[0] == TextPiece("<|im_start|>system\nMerge the notes.<|im_end|>\n<|im_start|>user\nNotes: ")
    assert pieces[2] == TextPiece(" / ")
    assert status.num_calls_done == 3
    assert sorted(c.num_cached_tokens > 0 for c in status.calls[:2]) == [False, True]  # one forked the other's
