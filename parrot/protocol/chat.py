"""Chat-form calls: messages whose contents are template text, rendered with the model's own chat
template around unrendered Semantic Variable placeholders.

A user writes roles, never a model's markers (`<|im_start|>user`): the manager, which knows the
model, renders the messages with its tokenizer's chat template. The SDK (to check a function's
parameters) and the manager (the authority) parse messages with this one parser.

Rules, on top of the template syntax (template.py):
- roles are system, user and assistant; outputs are in assistant messages only;
- the last output is in the last message, with only whitespace after it: the prompt ends there;
- plain `{{name}}` placeholders are resolved over all messages as in one template (the last plain
  one is the output when no output is explicit).

Rendering (`render_chat`): each placeholder stands in the messages as a marker (private-use
characters and its index), the chat template renders them as it renders any text (no generation
prompt: the last message is the assistant's reply so far, as Hugging Face's
`continue_final_message`), and the rendered text is cut after the last output. Constant text is
the template's output; the placeholders come back in order, each once. So the prompt's tokens are
the tokenizer's tokens for the chat-template-rendered prompt with the values filled in (for any
template that inserts a message's content as it is; one that trims it trims the constant text
around a placeholder, not a value).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parrot.protocol.errors import ParrotError
from parrot.protocol.template import (
    MAX_PLACEHOLDERS,
    Placeholder,
    PlaceholderKind,
    TemplatePiece,
    TextPiece,
    escape_text,
    scan,
)

ROLES = ("system", "user", "assistant")
_OPEN, _CLOSE = "\ue000", "\ue001"  # a placeholder's marker while the chat template renders
_MARKER = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")

Message = tuple[str, tuple[TemplatePiece, ...]]  # (role, pieces)


@dataclass(frozen=True)
class ParsedChat:
    messages: tuple[Message, ...]
    input_names: tuple[str, ...]  # first-appearance order, each once
    output_names: tuple[str, ...]  # prompt order, each exactly once


def parse_chat(messages: Sequence[tuple[str, str]], field: str = "messages") -> ParsedChat:
    """(role, content) pairs as pieces; ParrotError(400) naming `field[i].role` / `field[i].content`."""
    if not messages:
        raise ParrotError("a chat needs at least one message", field=field)
    scanned = []
    for i, (role, content) in enumerate(messages):
        if role not in ROLES:
            raise ParrotError(f"unknown role {role!r}: use system, user or assistant", field=f"{field}[{i}].role")
        raw, tail = scan(content, f"{field}[{i}].content")
        for _, kind, name in raw:
            if kind is not None and kind not in ("input", "output"):
                raise ParrotError(
                    f"unknown placeholder kind {kind!r} in {{{{{kind}:{name}}}}}: use {{{{input:name}}}} or "
                    "{{output:name}}",
                    field=f"{field}[{i}].content",
                )
        scanned.append((role, raw, tail))
    explicit = any(kind == "output" for _, raw, _ in scanned for _, kind, _ in raw)
    plain = [(i, j) for i, (_, raw, _) in enumerate(scanned) for j, (_, kind, _) in enumerate(raw) if kind is None]
    last_plain = plain[-1] if plain and not explicit else None

    parsed: list[Message] = []
    inputs: list[str] = []
    outputs: list[str] = []
    last_output = -1
    for i, (role, raw, tail) in enumerate(scanned):
        at = f"{field}[{i}].content"
        pieces: list[TemplatePiece] = []
        for j, (text, kind, name) in enumerate(raw):
            if text:
                pieces.append(TextPiece(text))
            is_output = kind == "output" or (i, j) == last_plain
            if is_output:
                if role != "assistant":
                    raise ParrotError(
                        f"output {name!r} in a {role} message: only the assistant's are generated", field=at
                    )
                if name in outputs:
                    raise ParrotError(f"output {name!r} appears twice; each output is generated once", field=at)
                outputs.append(name)
                last_output = i
            elif name not in inputs:
                inputs.append(name)
            pieces.append(Placeholder(name, PlaceholderKind.OUTPUT if is_output else PlaceholderKind.INPUT))
        if tail:
            pieces.append(TextPiece(tail))
        parsed.append((role, tuple(pieces)))

    if not outputs:
        raise ParrotError(
            "the chat has no output placeholder: end it with an assistant message {{output:name}}", field=field
        )
    last = f"{field}[{len(parsed) - 1}].content"
    if last_output != len(parsed) - 1:
        raise ParrotError(
            "the last output must be in the last message (later ones would never reach the model)", field=last
        )
    pieces = list(parsed[-1][1])
    after = pieces[-1] if isinstance(pieces[-1], TextPiece) else None
    if after is not None and (after.text.strip() or not isinstance(pieces[-2], Placeholder)):
        raise ParrotError(
            "only whitespace may follow the last output (text there would never reach the model)", field=last
        )
    both = set(inputs) & set(outputs)
    if both:
        raise ParrotError(f"{sorted(both)[0]!r} is used both as an input and an output", field=field)
    num_placeholders = sum(isinstance(p, Placeholder) for _, ps in parsed for p in ps)
    if num_placeholders > MAX_PLACEHOLDERS:
        message = f"the chat has {num_placeholders} placeholders; the limit is {MAX_PLACEHOLDERS}"
        raise ParrotError(message, field=field)
    return ParsedChat(tuple(parsed), tuple(inputs), tuple(outputs))


def render_chat(
    chat: ParsedChat, apply_chat_template: Callable[[list[dict[str, str]]], str], field: str = "messages"
) -> str:
    """The template text of the chat as `apply_chat_template` (the model's, without a generation
    prompt) renders its messages, placeholders kept, cut after the last output (module docstring).
    ParrotError(400) naming `field` when the chat template does not keep each placeholder once, in order."""
    messages: list[dict[str, str]] = []
    placeholders: list[Placeholder] = []
    for i, (role, pieces) in enumerate(chat.messages):
        parts = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                if _OPEN in piece.text or _CLOSE in piece.text:
                    raise ParrotError(
                        "the text holds U+E000 or U+E001 (private-use characters a chat-form call reserves)",
                        field=f"{field}[{i}].content",
                    )
                parts.append(piece.text)
            else:
                parts.append(f"{_OPEN}{len(placeholders)}{_CLOSE}")
                placeholders.append(piece)
        messages.append({"role": role, "content": "".join(parts)})
    rendered = apply_chat_template(messages)
    out: list[str] = []
    pos = 0
    for k, m in enumerate(_MARKER.finditer(rendered)):
        if k == len(placeholders) or int(m.group(1)) != k:
            break
        out += [escape_text(rendered[pos : m.start()]), f"{{{{{placeholders[k].kind.value}:{placeholders[k].name}}}}}"]
        pos = m.end()
        if k == len(placeholders) - 1:  # the last output: the prompt ends here
            return "".join(out)
    raise ParrotError(
        "the model's chat template does not keep each placeholder once and in order (it drops, repeats or moves "
        "message text): write this call as a template",
        field=field,
    )
