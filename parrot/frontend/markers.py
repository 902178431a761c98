"""Variables inside text: `str(var)` is a marker that a semantic call's input turns back into the variable.

    title = summarize(doc)
    review(f"Title: {title}\\n\\n{body}")   # one input: text, then `title`, then text, then `body`

A marker is `\\ue000parrot:<session key>/<var_id>\\ue001` (private-use characters, which real text
does not contain). The SDK never renders it: an input whose text holds markers becomes template
text with one placeholder per marker (inputs.py), so the server sees the dependency and runs the
consumer after the producer with no client round trip. This is also how text-only frameworks
(LangChain prompt templates, which format values with `str`) pass variables along unawaited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPEN = "\ue000"
CLOSE = "\ue001"
_MARKER = re.compile(f"{OPEN}parrot:([^{OPEN}{CLOSE}/]+)/([^{OPEN}{CLOSE}/]+){CLOSE}")


@dataclass(frozen=True)
class VarRef:
    """A variable named by a marker: the key of the session it belongs to (SessionCore.key, made
    by the client: a session has it before the server knows the session) and its id there."""

    session_key: str
    var_id: str


def marker(session_key: str, var_id: str) -> str:
    return f"{OPEN}parrot:{session_key}/{var_id}{CLOSE}"


def split_markers(text: str) -> list[str | VarRef]:
    """`text` as its pieces in order: plain text (never empty) and the variables its markers name."""
    parts: list[str | VarRef] = []
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            parts.append(text[pos : m.start()])
        parts.append(VarRef(m.group(1), m.group(2)))
        pos = m.end()
    if pos < len(text):
        parts.append(text[pos:])
    return parts
