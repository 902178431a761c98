"""A chat-form call's template: its messages rendered with the model's own chat template (the
tokenizer's), Semantic Variable placeholders kept (protocol/chat.py says how).

An application sends the same few message lists over and over (a map stage: one per chunk, the
same messages), so a rendered chat up to `_CACHED_CHARS` characters is kept per tokenizer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from parrot.protocol.chat import parse_chat, render_chat
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import ChatMessage
from parrot.protocol.template import ParsedTemplate, parse_template
from parrot.text import ChatTemplateError, Tokenizer

_CACHED_CHARS = 16384  # x 512 chats: at most 8 M characters held
_FIELD = "messages"


def chat_template(tokenizer: Tokenizer, messages: Sequence[ChatMessage], field: str = _FIELD) -> ParsedTemplate:
    """The call's template; ParrotError(400) naming `field` (or one of its messages)."""
    key = tuple((m.role, m.content) for m in messages)
    try:
        if sum(len(content) for _, content in key) <= _CACHED_CHARS:
            text = _rendered_cached(tokenizer, key)
        else:
            text = _rendered(tokenizer, key)
        return parse_template(text, field=_FIELD)
    except ParrotError as e:  # named as the caller names the messages
        where = e.field or _FIELD
        raise ParrotError(e.message, status=e.status, field=field + where.removeprefix(_FIELD)) from None


def _rendered(tokenizer: Tokenizer, messages: tuple[tuple[str, str], ...]) -> str:
    chat = parse_chat(messages, _FIELD)

    def apply(rendered: list[dict[str, str]]) -> str:
        try:
            return tokenizer.apply_chat_template(list(rendered), add_generation_prompt=False)
        except ChatTemplateError as e:
            raise ParrotError(f"the model's chat template refused the messages: {e}", field=_FIELD) from None

    return render_chat(chat, apply, _FIELD)


_rendered_cached = functools.lru_cache(maxsize=512)(_rendered)
