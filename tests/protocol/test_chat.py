"""Chat-form calls: parsing messages (roles, placeholder kinds, where outputs may be) and rendering
them with a chat template around unrendered placeholders (protocol/chat.py)."""

from __future__ import annotations

import pytest

from parrot.protocol.chat import parse_chat, render_chat
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import CallSpec, ChatMessage
from parrot.protocol.template import Placeholder, PlaceholderKind, TextPiece, parse_template

IN, OUT = PlaceholderKind.INPUT, PlaceholderKind.OUTPUT


def chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_pieces_and_names_per_message() -> None:
    chat = parse_chat([("system", "Doc: {{input:doc}}"), ("user", "{{q}}"), ("assistant", "A: {{output:a}}\n")])
    assert chat.messages == (
        ("system", (TextPiece("Doc: "), Placeholder("doc", IN))),
        ("user", (Placeholder("q", IN),)),
        ("assistant", (TextPiece("A: "), Placeholder("a", OUT), TextPiece("\n"))),
    )
    assert (chat.input_names, chat.output_names) == (("doc", "q"), ("a",))


def test_plain_placeholders_resolve_over_all_messages() -> None:
    # No explicit output: the last plain placeholder of the whole chat is the output.
    chat = parse_chat([("user", "{{x}} and {{y}}"), ("assistant", "{{z}}")])
    assert (chat.input_names, chat.output_names) == (("x", "y"), ("z",))
    assert chat.messages[1] == ("assistant", (Placeholder("z", OUT),))


@pytest.mark.parametrize(
    ("messages", "field", "message"),
    [
        ([], "messages", "a chat needs at least one message"),
        ([("robot", "{{output:a}}")], "messages[0].role", "unknown role 'robot': use system, user or assistant"),
        (
            [("user", "Hi {{output:a}}")],
            "messages[0].content",
            "output 'a' in a user message: only the assistant's are generated",
        ),
        (
            [("user", "Hi"), ("assistant", "Sure.")],
            "messages",
            "the chat has no output placeholder: end it with an assistant message {{output:name}}",
        ),
        (
            [("assistant", "{{output:a}}"), ("user", "more")],
            "messages[1].content",
            "the last output must be in the last message (later ones would never reach the model)",
        ),
        (
            [("user", "Hi"), ("assistant", "{{output:a}} and more")],
            "messages[1].content",
            "only whitespace may follow the last output (text there would never reach the model)",
        ),
        (
            [("user", "{{input:a}}"), ("assistant", "{{output:a}}")],
            "messages",
            "'a' is used both as an input and an output",
        ),
        (
            [("assistant", "{{output:a}}{{output:a}}")],
            "messages[0].content",
            "output 'a' appears twice; each output is generated once",
        ),
        (
            [("user", "{{inptu:x}}"), ("assistant", "{{output:a}}")],
            "messages[0].content",
            "unknown placeholder kind 'inptu' in {{inptu:x}}: use {{input:name}} or {{output:name}}",
        ),
    ],
)
def test_bad_chats_name_the_field(messages: list[tuple[str, str]], field: str, message: str) -> None:
    with pytest.raises(ParrotError) as info:
        parse_chat(messages)
    assert (info.value.status, info.value.field, info.value.message) == (400, field, message)


def test_render_keeps_placeholders_and_cuts_after_the_last_output() -> None:
    chat = parse_chat([("system", "Doc {{input:d}}."), ("user", "Q: {{input:q}}"), ("assistant", "A:{{output:a}}")])
    text = render_chat(chat, chatml)
    assert text == (
        "<|im_start|>system\nDoc {{input:d}}.<|im_end|>\n<|im_start|>user\nQ: {{input:q}}<|im_end|>\n"
        "<|im_start|>assistant\nA:{{output:a}}"
    )
    assert [p for p in parse_template(text).pieces if isinstance(p, Placeholder)] == [
        Placeholder("d", IN),
        Placeholder("q", IN),
        Placeholder("a", OUT),
    ]


def test_render_escapes_literal_braces_and_keeps_outputs_between_messages() -> None:
    chat = parse_chat(
        [("user", r"Literal \{{ here"), ("assistant", "{{output:a}}"), ("user", "Why?"), ("assistant", "{{output:b}}")]
    )
    text = render_chat(chat, chatml)
    assert text == (
        "<|im_start|>user\nLiteral \\{{ here<|im_end|>\n<|im_start|>assistant\n{{output:a}}<|im_end|>\n"
        "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n{{output:b}}"
    )
    assert parse_template(text).pieces[0] == TextPiece(
        "<|im_start|>user\nLiteral {{ here<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_drops_or_repeats_a_placeholder_is_refused() -> None:
    chat = parse_chat([("system", "{{input:s}}"), ("user", "{{input:q}}"), ("assistant", "{{output:a}}")])

    def drops_system(messages: list[dict[str, str]]) -> str:
        return chatml([m for m in messages if m["role"] != "system"])

    def repeats(messages: list[dict[str, str]]) -> str:
        return chatml(messages[:1] + messages)

    for template in (drops_system, repeats):
        with pytest.raises(ParrotError) as info:
            render_chat(chat, template)
        assert info.value.field == "messages"
        assert info.value.message.startswith("the model's chat template does not keep each placeholder once")


def test_private_use_marker_characters_in_text_are_refused() -> None:
    chat = parse_chat([("user", "a\ue000b"), ("assistant", "{{output:a}}")])
    with pytest.raises(ParrotError) as info:
        render_chat(chat, chatml)
    assert info.value.field == "messages[0].content"


def test_a_call_spec_has_a_template_or_messages() -> None:
    message = ChatMessage(role="assistant", content="{{output:a}}")
    assert CallSpec(messages=[message]).num_chars == len("{{output:a}}")
    for fields in ({}, {"template": "x{{output:a}}", "messages": [message]}):
        with pytest.raises(ValueError, match="give exactly one of template or messages"):
            CallSpec(**fields)  # type: ignore[arg-type]
