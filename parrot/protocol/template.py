"""Template syntax: prompt text with Semantic Variable placeholders, parsed into pieces.

Both the client SDK (to check a function's parameters against its template) and the manager (the
authority: it parses every submitted template) use this one parser, so the syntax has one owner.

Syntax:
    {{input:name}}   an input SV, filled into the prompt
    {{output:name}}  an output SV, generated at this point of the prompt
    {{name}}         by position: the last plain placeholder is the output when the template names
                     no explicit output; every other plain placeholder is an input
Names are identifiers (`[A-Za-z_][A-Za-z0-9_]*`). Every other `{{` is an error naming its
position (a typo must not silently become prompt text), unless escaped: `\\{{` is a literal `{{`
(`escape_text` escapes any text for a template). In a run of braces the last `{{` opens the
placeholder, so `{{{input:x}}}` is `{`, the input, `}`. `}}` alone is always literal.
Only whitespace may follow the last output: text there would never reach the model.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum

from parrot.protocol.errors import ParrotError

MAX_PLACEHOLDERS = 256

# `{{ kind:name }}` or `{{ name }}`; kind is checked after the match so a typo is an error, not text.
_PLACEHOLDER = re.compile(r"\{\{\s*(?:([A-Za-z_][A-Za-z0-9_]*)\s*:\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_OPEN = re.compile(r"\\\{\{|\{\{")  # an escaped `\{{` or a `{{`
ESCAPE = "\\{{"


def escape_text(text: str) -> str:
    """`text` as constant template text: every `{{` escaped, so it parses back to `text` itself."""
    return text.replace("{{", ESCAPE)


def _malformed(template: str, pos: int, field: str) -> ParrotError:
    line = template.count("\n", 0, pos) + 1
    column = pos - (template.rfind("\n", 0, pos) + 1) + 1
    snippet = template[pos : pos + 24]
    return ParrotError(
        f"malformed placeholder at character {pos} (line {line}, column {column}): {snippet!r}; "
        "write {{input:name}}, {{output:name}} or {{name}}, or \\{{ for a literal {{",
        field=field,
    )


def scan(template: str, field: str) -> tuple[list[tuple[str, str | None, str]], str]:
    """(text before, kind or None, name) per placeholder, and the text after the last one; escapes
    resolved in the text. Raises ParrotError at the first `{{` that starts no placeholder. The
    kinds are not checked here (`parse_template`, chat.parse_chat do)."""
    raw: list[tuple[str, str | None, str]] = []
    text: list[str] = []
    pos = 0
    while (m := _OPEN.search(template, pos)) is not None:
        text.append(template[pos : m.start()])
        if m.group(0) == ESCAPE:
            text.append("{{")
            pos = m.end()
            continue
        start = m.start()
        while template.startswith("{", start + 2):  # `{{{`: the last `{{` opens the placeholder
            start += 1
        text.append(template[m.start() : start])
        pm = _PLACEHOLDER.match(template, start)
        if pm is None:
            raise _malformed(template, start, field)
        raw.append(("".join(text), pm.group(1), pm.group(2)))
        text = []
        pos = pm.end()
    text.append(template[pos:])
    return raw, "".join(text)


class PlaceholderKind(StrEnum):
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class Placeholder:
    name: str
    kind: PlaceholderKind


TemplatePiece = TextPiece | Placeholder


@dataclass(frozen=True)
class ParsedTemplate:
    """A template as pieces in prompt order; empty text pieces are dropped."""

    pieces: tuple[TemplatePiece, ...]
    input_names: tuple[str, ...]  # first-appearance order, each once (an input may repeat)
    output_names: tuple[str, ...]  # prompt order, each exactly once

    @property
    def first_output_index(self) -> int:
        return next(
            i for i, p in enumerate(self.pieces) if isinstance(p, Placeholder) and p.kind is PlaceholderKind.OUTPUT
        )


def parse_template(template: str, field: str = "template") -> ParsedTemplate:
    """Split `template` into text and placeholders; raise ParrotError(400, field) if malformed.
    Templates up to `_CACHED_CHARS` characters are parsed once (an app sends the same few over and
    over: a GPTs request's 4,000-character system prompt costs ~0.5 ms to scan each time)."""
    if len(template) > _CACHED_CHARS:
        return _parse(template, field)
    try:
        return _parse_cached(template)
    except ParrotError as e:  # not cached: the message again, naming the caller's field
        raise ParrotError(e.message, status=e.status, field=field) from None


_CACHED_CHARS = 16384  # x 512 templates: at most 8 M characters held


@functools.lru_cache(maxsize=512)
def _parse_cached(template: str) -> ParsedTemplate:
    return _parse(template, "template")


def _parse(template: str, field: str) -> ParsedTemplate:
    raw, tail = scan(template, field)
    for _, kind, name in raw:
        if kind is not None and kind not in ("input", "output"):
            raise ParrotError(
                f"unknown placeholder kind {kind!r} in {{{{{kind}:{name}}}}}: "
                "use {{input:name}} or {{output:name}}",
                field=field,
            )
    if len(raw) > MAX_PLACEHOLDERS:
        raise ParrotError(f"template has {len(raw)} placeholders; the limit is {MAX_PLACEHOLDERS}", field=field)

    has_explicit_output = any(kind == "output" for _, kind, _ in raw)
    last_plain = max((i for i, (_, kind, _) in enumerate(raw) if kind is None), default=-1)
    pieces: list[TemplatePiece] = []
    inputs: list[str] = []
    outputs: list[str] = []
    for i, (text, kind, name) in enumerate(raw):
        if text:
            pieces.append(TextPiece(text))
        if kind is None:
            kind = "output" if (not has_explicit_output and i == last_plain) else "input"
        if kind == "output":
            if name in outputs:
                raise ParrotError(f"output {name!r} appears twice; each output is generated once", field=field)
            outputs.append(name)
        elif name not in inputs:
            inputs.append(name)
        pieces.append(Placeholder(name, PlaceholderKind(kind)))

    if not outputs:
        raise ParrotError("template has no output placeholder: add {{output:name}}", field=field)
    both = set(inputs) & set(outputs)
    if both:
        raise ParrotError(f"{sorted(both)[0]!r} is used both as an input and an output", field=field)
    last_output = max(
        i for i, p in enumerate(pieces) if isinstance(p, Placeholder) and p.kind is PlaceholderKind.OUTPUT
    )
    if last_output != len(pieces) - 1 or tail.strip():
        raise ParrotError(
            "only whitespace may follow the last output placeholder (text there would never reach the model)",
            field=field,
        )
    if not isinstance(pieces[0], TextPiece) and pieces[0].kind is PlaceholderKind.OUTPUT:
        raise ParrotError("the template starts with an output: there is no prompt to generate from", field=field)
    return ParsedTemplate(tuple(pieces), tuple(inputs), tuple(outputs))
