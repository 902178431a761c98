"""Template parsing: pieces, placeholder kinds, positional defaults and every refusal."""

from __future__ import annotations

import pytest

from parrot.protocol.errors import ParrotError
from parrot.protocol.template import (
    ParsedTemplate,
    Placeholder,
    PlaceholderKind,
    TextPiece,
    escape_text,
    parse_template,
)

IN, OUT = PlaceholderKind.INPUT, PlaceholderKind.OUTPUT


def test_explicit_placeholders_split_into_pieces() -> None:
    parsed = parse_template("Summarize {{input:doc}} in {{ input : n }} words:{{output:summary}}\n")
    assert parsed == ParsedTemplate(
        pieces=(
            TextPiece("Summarize "),
            Placeholder("doc", IN),
            TextPiece(" in "),
            Placeholder("n", IN),
            TextPiece(" words:"),
            Placeholder("summary", OUT),
        ),
        input_names=("doc", "n"),
        output_names=("summary",),
    )
    assert parsed.first_output_index == 5


def test_multi_output_and_repeated_input() -> None:
    parsed = parse_template("A {{input:x}} B {{output:y}} C {{input:x}} D {{output:z}}")
    assert parsed.input_names == ("x",)
    assert parsed.output_names == ("y", "z")
    assert [type(p).__name__ for p in parsed.pieces] == [
        "TextPiece",
        "Placeholder",
        "TextPiece",
        "Placeholder",
        "TextPiece",
        "Placeholder",
        "TextPiece",
        "Placeholder",
    ]


def test_plain_placeholders_default_by_position() -> None:
    parsed = parse_template("Translate {{text}} to {{lang}}: {{result}}")
    assert parsed.input_names == ("text", "lang")
    assert parsed.output_names == ("result",)
    # With an explicit output, every plain placeholder is an input.
    parsed = parse_template("Q: {{q}} A:{{output:a}}")
    assert parsed.input_names == ("q",)
    assert parsed.output_names == ("a",)


def test_escaped_braces_are_literal_text() -> None:
    parsed = parse_template('JSON \\{{"k": 1}} and \\{{ 1 + 2 }} then {{output:o}}')
    assert parsed.pieces[0] == TextPiece('JSON {{"k": 1}} and {{ 1 + 2 }} then ')
    assert parsed.output_names == ("o",)
    text = "code {{x}} and {{{{ and }} \\{{ end "
    assert escape_text(text) == "code \\{{x}} and \\{{\\{{ and }} \\\\{{ end "
    assert parse_template(escape_text(text) + "{{output:o}}").pieces[0] == TextPiece(text)


def test_a_run_of_braces_opens_the_placeholder_at_its_last_pair() -> None:
    parsed = parse_template('{"q": {{{input:q}}}} A:{{output:a}}')
    assert parsed.pieces[:3] == (TextPiece('{"q": {'), Placeholder("q", IN), TextPiece("}} A:"))


@pytest.mark.parametrize(
    ("template", "position"),
    [
        ("Hi {{input:x {{output:y}}", "character 3 (line 1, column 4)"),  # unclosed
        ('X {{"k": 1}} {{output:o}}', "character 2 (line 1, column 3)"),  # not a placeholder
        ("a\nbc {{}} {{output:o}}", "character 5 (line 2, column 4)"),  # empty
        ("A {{input:two words}} {{output:o}}", "character 2 (line 1, column 3)"),
        ("A {{output:o}} {{", "character 15 (line 1, column 16)"),
    ],
)
def test_malformed_placeholders_are_refused_naming_their_position(template: str, position: str) -> None:
    with pytest.raises(ParrotError) as info:
        parse_template(template, field="calls[0].template")
    assert info.value.message.startswith(f"malformed placeholder at {position}")
    assert [info.value.status, info.value.field] == [400, "calls[0].template"]


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("Hi {{inptu:x}} {{output:y}}", "unknown placeholder kind 'inptu'"),
        ("Hi {{input:x}}", "no output placeholder"),
        ("Hi {{output:y}} and {{output:y}}", "output 'y' appears twice"),
        ("Hi {{input:y}} {{output:y}}", "'y' is used both as an input and an output"),
        ("Hi {{output:y}} trailing", "only whitespace may follow the last output"),
        ("Hi {{output:y}} {{input:x}}", "only whitespace may follow the last output"),
        ("{{output:y}}", "starts with an output"),
    ],
)
def test_malformed_templates_are_refused_naming_the_field(template: str, needle: str) -> None:
    with pytest.raises(ParrotError) as info:
        parse_template(template, field="calls[3].template")
    assert needle in info.value.message
    assert info.value.status == 400
    assert info.value.field == "calls[3].template"


def test_placeholder_count_limit() -> None:
    template = "".join(f"{{{{input:x{i}}}}} " for i in range(300)) + "{{output:o}}"
    with pytest.raises(ParrotError, match="301 placeholders; the limit is 256"):
        parse_template(template)
