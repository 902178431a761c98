"""Tools in a chat prompt, and tool calls read back from a model's output.

A chat template that knows tools (its source names `tools`) gets them as the `tools` variable and
the messages as OpenAI sends them (an assistant's `tool_calls`, `tool` results), as transformers
passes them. A template that does not (SmolLM2's ChatML) gets a plain transcript in the
Hermes convention most open models are tuned on: the tools described in the system message, an
assistant's calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, a tool's
result as a user message in `<tool_response>` tags. The output is read back the same way
(`parse_tool_calls`); a constrained call (tool_choice required or named) is the bare JSON object
`tool_call_schema` describes.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

_INSTRUCTIONS = (
    "You may call functions to answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with a JSON object naming it and its arguments in tags, one per call:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments object>}}\n</tool_call>'
)


def plain_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """OpenAI messages (with tool calls and results) for a template that knows only role and text."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
            continue
        calls = [_call_block(c["function"]) for c in m.get("tool_calls") or []]
        out.append({"role": role, "content": "\n".join([content] * bool(content) + calls)})
    if tools:
        described = _INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _call_block(function: dict[str, Any]) -> str:
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = arguments  # passed on as the client wrote it
    body = json.dumps({"name": function["name"], "arguments": parsed}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """The content before the first tool call (None if blank) and the calls as (name, arguments
    JSON text). Only well-formed calls of known functions count; with none, the text is content."""
    calls: list[tuple[str, str]] = []
    start = text.find(TOOL_CALL_OPEN)
    rest = text[start:] if start >= 0 else ""
    while rest.startswith(TOOL_CALL_OPEN):
        end = rest.find(TOOL_CALL_CLOSE)
        body = rest[len(TOOL_CALL_OPEN) : end if end >= 0 else len(rest)]
        call = read_call(body, names)
        if call is None:
            break
        calls.append(call)
        rest = rest[end + len(TOOL_CALL_CLOSE) :].lstrip() if end >= 0 else ""
    if not calls:
        return text, []
    content = text[:start].strip()
    return content or None, calls


def streamable_len(text: str) -> int:
    """How much of a growing output can be streamed as content now: up to its first tool-call tag,
    less a tail that may be the beginning of one."""
    start = text.find(TOOL_CALL_OPEN)
    if start >= 0:
        return start
    for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:k]):
            return len(text) - k
    return len(text)


def read_call(body: str, names: set[str]) -> tuple[str, str] | None:
    """One call's JSON object {"name": ..., "arguments": {...}} as (name, arguments text)."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names or not isinstance(value.get("arguments"), dict):
        return None
    return value["name"], json.dumps(value["arguments"], ensure_ascii=False)


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call of any of `tools` (their `function` specs)."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}
