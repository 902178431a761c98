"""Chat-form semantic functions: a prompt written as roles, never as a model's chat markers.

    @semantic_function(chat=True)
    def answer(document: Input, question: Input, answer: Output):
        \"\"\"system: Answer questions about this document.
        {{input:document}}
        user: {{input:question}}
        assistant: {{output:answer}}\"\"\"

    answer = SemanticFunction("answer", [system("..."), user("{{input:question}}"), assistant("{{output:answer}}")],
                              inputs=["question"], outputs={"answer": None})

The manager renders the messages with the model's own chat template (it knows the model; the
client does not), placeholders left unrendered, so the prompt's tokens are the tokenizer's for
the chat-template-rendered prompt with the values filled in, and prefix sharing works at every
variable boundary as for a template (protocol/chat.py). Outputs go in assistant messages; the last
message is the assistant's, ending with the last output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from parrot.protocol.chat import ROLES
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import ChatMessage

__all__ = ["ChatMessage", "assistant", "docstring_messages", "system", "user"]

# A role line of a chat docstring: `system:`, `user:` or `assistant:` at the start of a line.
_ROLE_LINE = re.compile(rf"^({'|'.join(ROLES)}):[ \t]?", re.M)


def system(content: str) -> ChatMessage:
    return ChatMessage(role="system", content=content)


def user(content: str) -> ChatMessage:
    return ChatMessage(role="user", content=content)


def assistant(content: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=content)


def docstring_messages(text: str, where: str) -> list[ChatMessage]:
    """The messages of a chat docstring: a line starting `system:`, `user:` or `assistant:` begins a
    message, which runs to the next such line; each message's text is stripped of the whitespace
    around it. ParrotError naming `where` for text before the first role line or no role line."""
    starts = list(_ROLE_LINE.finditer(text))
    if not starts or text[: starts[0].start()].strip():
        raise ParrotError(
            f"{where}: a chat docstring starts with a role line (system:, user: or assistant:)", field=where
        )
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return [
        ChatMessage(role=m.group(1), content=text[m.end() : end].strip())  # type: ignore[arg-type]
        for m, end in zip(starts, ends, strict=True)
    ]


def as_messages(messages: Sequence[ChatMessage | tuple[str, str]], where: str) -> list[ChatMessage]:
    """Messages given as ChatMessage or (role, content) pairs."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, ChatMessage):
            out.append(m)
        elif isinstance(m, tuple) and len(m) == 2 and m[0] in ROLES and isinstance(m[1], str):
            out.append(ChatMessage(role=m[0], content=m[1]))  # type: ignore[arg-type]
        else:
            raise ParrotError(
                f"{where}[{i}]: a message is system(...), user(...), assistant(...) or a (role, text) pair "
                f"with a role of {list(ROLES)}",
                field=f"{where}[{i}]",
            )
    return out
