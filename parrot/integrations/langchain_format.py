"""LangChain messages and tools as prompt text, and a model's JSON reply as a LangChain message.

Pure functions for `langchain.py`. Messages render as ChatML (`<|im_start|>role ... <|im_end|>`,
the default model's format; `ChatParrot(chat_format=...)` takes another renderer). Text stays as it
is, markers of Semantic Variables included: the SDK turns them into placeholders.

Tools are rendered into the prompt (a system message listing each tool's name, description and
argument schema) and the reply is constrained by a JSON schema (`json_schema` sampling): one object,
`{"tool": name, "arguments": {...}}` to call a tool or `{"tool": "none", "answer": "..."}` to
answer. So tool calling needs no engine feature beyond JSON-schema constrained decoding, and the
tool-call reply is a Semantic Variable like any other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call

ChatFormat = Callable[[Sequence[BaseMessage]], str]
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "chat": "user"}
NO_TOOL = "none"


def message_text(message: BaseMessage) -> str:
    """A message's content as text (text blocks joined; other blocks are refused)."""
    content = message.content
    if isinstance(content, str):
        return content
    texts = []
    for block in content:
        if isinstance(block, str):
            texts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        else:
            raise ValueError(f"a {message.type} message holds a {block!r} block: Parrot models take text only")
    return "".join(texts)


def chatml(messages: Sequence[BaseMessage]) -> str:
    """The messages in ChatML, ending where the assistant's reply begins."""
    out = []
    for message in messages:
        role = _ROLES.get(message.type)
        if role is None:
            raise ValueError(f"a {message.type!r} message has no role in a chat prompt")
        text = message_text(message)
        if isinstance(message, AIMessage) and message.tool_calls:  # as the model wrote it
            text = json.dumps({"tool": message.tool_calls[0]["name"], "arguments": message.tool_calls[0]["args"]})
        if isinstance(message, ToolMessage):
            text = f"Result of {message.name or message.tool_call_id}: {text}"
        out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def tools_prompt(tools: Sequence[dict[str, Any]], tool_choice: str | None) -> str:
    """A system message's text: the tools (OpenAI tool format) and how to reply."""
    lines = ["You can call these tools:"]
    for tool in tools:
        fn = tool["function"]
        params = json.dumps(fn.get("parameters", {}), sort_keys=True)
        lines.append(f"- {fn['name']}: {fn.get('description', '')} Arguments (JSON schema): {params}")
    lines.append('Reply with one JSON object: {"tool": "<name>", "arguments": {...}} to call a tool')
    if _answer_allowed(tool_choice):
        lines[-1] += ', or {"tool": "none", "answer": "<your reply>"} to answer'
    return "\n".join(lines) + "."


def tool_call_schema(tools: Sequence[dict[str, Any]], tool_choice: str | None) -> dict[str, Any]:
    """The JSON schema of a reply: one branch per tool callable under `tool_choice`, and the
    answer unless a tool must be called."""
    names = [t["function"]["name"] for t in tools]
    if tool_choice not in (None, "auto", "any", "required", NO_TOOL) and tool_choice not in names:
        raise ValueError(f"tool_choice {tool_choice!r} is no bound tool (the tools: {names})")
    branches = []
    for tool in tools:
        fn = tool["function"]
        if tool_choice in (None, "auto", "any", "required") or tool_choice == fn["name"]:
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            branches.append(_object({"tool": {"enum": [fn["name"]]}, "arguments": params}))
    if _answer_allowed(tool_choice):
        branches.append(_object({"tool": {"enum": [NO_TOOL]}, "answer": {"type": "string"}}))
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _answer_allowed(tool_choice: str | None) -> bool:
    return tool_choice in (None, "auto", NO_TOOL)


def tool_reply(text: str, call_id: str) -> AIMessage:
    """The model's JSON reply as an AIMessage: a tool call, an answer, or an invalid tool call
    (text that is not a reply of the schema) that an agent can show the model."""
    try:
        reply = json.loads(text, strict=False)  # a control character inside a string is no reason to fail
        name = reply["tool"]
        if name == NO_TOOL:
            return AIMessage(content=str(reply["answer"]))
        args = reply["arguments"]
        if not isinstance(name, str) or not isinstance(args, dict):
            raise TypeError("tool must be a name and arguments an object")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        bad = invalid_tool_call(name=None, args=text, id=call_id, error=f"not a tool call: {type(e).__name__}: {e}")
        return AIMessage(content=text, invalid_tool_calls=[bad])
    return AIMessage(content="", tool_calls=[tool_call(name=name, args=args, id=call_id)])
