"""A call's inputs as bindings: plain values, variables, text with variables in it, and lists.

An input takes a SemanticVariable (bound by id), text or a number (sent inline), text holding
variable markers (`f"Title: {title}"`, markers.py), or a list of any of these, which renders as
the input's `Input(...)` says: numbered lines by default (`1. a\\n2. b`), or joined with `sep`.

Nothing is rendered here. An input that mixes text and variables is expanded in the template: its
placeholder becomes the text with one placeholder per variable (`{{input:items__1}}`), so the
server still sees each variable, runs the call once they are set, and shares prefixes at their
boundaries. An input that is only text is one inline value; one that is one variable is bound to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parrot.frontend.markers import VarRef, split_markers
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.chat import ParsedChat, parse_chat
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, ChatMessage
from parrot.protocol.template import (
    ParsedTemplate,
    Placeholder,
    PlaceholderKind,
    TemplatePiece,
    TextPiece,
    escape_text,
    parse_template,
)

Part = str | VarRef


class Input:
    """Marks a parameter as an input placeholder (unmarked parameters are inputs too) and says how a
    list given to it renders: `Input()` numbers the items, one per line (`1. a\\n2. b`);
    `Input(numbered=False, sep=", ")` joins them with `sep`."""

    def __init__(self, *, numbered: bool = True, sep: str = "\n") -> None:
        self.numbered = numbered
        self.sep = sep

    def __repr__(self) -> str:
        return f"Input(numbered={self.numbered}, sep={self.sep!r})"


def parts_of(value: Any, style: Input, where: str) -> list[Part]:
    """`value` as text pieces and variables, in order (adjacent text merged)."""
    if isinstance(value, SemanticVariable):
        return [value.ref]
    if isinstance(value, str):
        return split_markers(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list | tuple):
        parts: list[Part] = []
        for i, item in enumerate(value):
            if isinstance(item, list | tuple):
                raise TypeError(f"{where}[{i}]: a list item takes a SemanticVariable or text, not a list")
            if i:
                parts.append(style.sep)
            if style.numbered:
                parts.append(f"{i + 1}. ")
            parts += parts_of(item, style, f"{where}[{i}]")
        return _merged(parts)
    raise TypeError(f"{where}: an input takes a SemanticVariable, text or a list of them, not {type(value)}")


def _merged(parts: Sequence[Part]) -> list[Part]:
    out: list[Part] = []
    for part in parts:
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        elif part != "":
            out.append(part)
    return out


def bind_inputs(
    template: str, parsed: ParsedTemplate, parts: Mapping[str, list[Part]], session_key: str, where: str
) -> tuple[str, dict[str, Binding]]:
    """The call's template and input bindings: the template as it is unless an input mixes text
    and variables (module docstring). Raises ParrotError naming an input that holds a variable of
    another session, or an expansion past the template limits."""
    bindings, subs, taken = _bindings(parsed.input_names, parsed.output_names, parts, session_key)
    if not subs:
        return template, bindings
    text = _serialize(_expanded(parsed.pieces, subs), bindings, taken)
    parse_template(text, field=where)  # e.g. more placeholders than a template may have
    return text, bindings


def bind_chat_inputs(
    chat: ParsedChat,
    messages: Sequence[ChatMessage],
    parts: Mapping[str, list[Part]],
    session_key: str,
    where: str,
) -> tuple[list[ChatMessage], dict[str, Binding]]:
    """`bind_inputs` for a chat-form call: its messages (each expanded as a template would be) and
    input bindings."""
    bindings, subs, taken = _bindings(chat.input_names, chat.output_names, parts, session_key)
    if not subs:
        return list(messages), bindings
    expanded = [
        ChatMessage(role=m.role, content=_serialize(_expanded(pieces, subs), bindings, taken))
        for m, (_, pieces) in zip(messages, chat.messages, strict=True)
    ]
    parse_chat([(m.role, m.content) for m in expanded], field=where)  # e.g. more placeholders than allowed
    return expanded, bindings


Subs = dict[str, list[str | Placeholder]]


def _bindings(
    input_names: Sequence[str], output_names: Sequence[str], parts: Mapping[str, list[Part]], session_key: str
) -> tuple[dict[str, Binding], Subs, set[str]]:
    """The bindings of the inputs, and for each input that mixes text and variables, what its
    placeholder expands to (text and a placeholder per variable, each bound); the names taken."""
    bindings: dict[str, Binding] = {}
    expanded: dict[str, list[Part]] = {}
    for name, ps in parts.items():
        foreign = [p for p in ps if isinstance(p, VarRef) and p.session_key != session_key]
        if foreign:
            raise ParrotError(f"{name!r}: the variable {foreign[0].var_id!r} belongs to another session", field=name)
        if not any(isinstance(p, VarRef) for p in ps):
            bindings[name] = Binding(value="".join(str(p) for p in ps))
        elif len(ps) == 1:
            assert isinstance(ps[0], VarRef)
            bindings[name] = Binding(var_id=ps[0].var_id)
        else:
            expanded[name] = ps
    taken = set(input_names) | set(output_names)
    subs: Subs = {}
    for name, ps in expanded.items():
        subs[name] = []
        for k, p in enumerate(ps):
            if isinstance(p, str):
                subs[name].append(p)
                continue
            sub = f"{name}__{k}"
            while sub in taken:
                sub = "_" + sub
            taken.add(sub)
            bindings[sub] = Binding(var_id=p.var_id)
            subs[name].append(Placeholder(sub, PlaceholderKind.INPUT))
    return bindings, subs, taken


def _expanded(pieces: Sequence[TemplatePiece], subs: Subs) -> list[str | Placeholder]:
    """Text (unescaped) and placeholders in prompt order, each expanded input's placeholder replaced."""
    segments: list[str | Placeholder] = []
    for piece in pieces:
        if isinstance(piece, TextPiece):
            segments.append(piece.text)
        elif piece.name in subs:
            segments += subs[piece.name]
        else:
            segments.append(piece)
    return segments


def _serialize(segments: list[str | Placeholder], bindings: dict[str, Binding], taken: set[str]) -> str:
    """Template text for the segments: adjacent text joined, then escaped. Text ending in a
    backslash right before a placeholder cannot be written (`\\{{` is an escape): those
    backslashes become an inline value of their own."""
    out: list[str] = []
    text = ""
    for seg in [*segments, None]:
        if isinstance(seg, str):
            text += seg
            continue
        slashes = text[len(text.rstrip("\\")) :] if seg is not None else ""
        if text[: len(text) - len(slashes)]:
            out.append(escape_text(text[: len(text) - len(slashes)]))
        if slashes:
            name = f"text__{len(out)}"
            while name in taken:
                name = "_" + name
            taken.add(name)
            bindings[name] = Binding(value=slashes)
            out.append(f"{{{{input:{name}}}}}")
        text = ""
        if seg is not None:
            out.append(f"{{{{{seg.kind.value}:{seg.name}}}}}")
    return "".join(out)
