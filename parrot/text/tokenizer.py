"""The model's tokenizer (Hugging Face `tokenizer.json`) and its own chat template.

Owned by whoever loads a model folder; immutable after load, so one instance may be shared by
threads (the `tokenizers` library releases the GIL while encoding).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

from parrot.text.recent import RecentTexts, stable_head
from parrot.text.tools import plain_messages

# The one pre-tokenizer rule that reads ahead of a pre-token's start: contractions (`'re`, `'ll`,
# `'ve` in GPT-2's and Llama 3's regexes). A pre-token starting with an apostrophe closer than this
# to the end may still become one ("x'r" + "e"); every other rule decides within the pre-token.
_CONTRACTION_LEN = 3
_GIL_FREE_CHARS = 8192  # texts longer than this are tokenized with the GIL released
_WINDOW = 64  # characters of a text's tail pre-tokenized first to find its stable end (doubled as needed)
# A known prefix (encode_offsets) is cached from this many characters, up to the longest kept.
_PREFIX_MIN_CHARS = 512
_PREFIX_MAX_CHARS = 65536
_PREFIXES_KEPT = 256
# Texts without a known prefix (a plain request's whole prompt) are matched against recent ones at
# every multiple of _PREFIX_MIN_CHARS characters (recent.py); this many characters of them are kept.
_RECENT_CHARS_KEPT = 1 << 20


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (its own `raise_exception`, or a render error)."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class Tokenizer:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self._tok = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        # Added tokens are matched in the text before pre-tokenization (whatever the pre-tokenizer).
        self._added = [t.content for t in self._tok.get_added_tokens_decoder().values() if len(t.content) > 1]
        self._resumable = _resumes_at_pre_token_boundaries(json.loads(self._tok.to_str()))
        self._prefix_tokens = functools.lru_cache(maxsize=_PREFIXES_KEPT)(self._stable_prefix_tokens)
        self._recent = RecentTexts(self.stable_len, _PREFIX_MIN_CHARS, _PREFIX_MAX_CHARS, _RECENT_CHARS_KEPT)
        template = cfg.get("chat_template")
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        self._chat_template = None
        self.template_knows_tools = bool(template and "tools" in template)
        if template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._chat_template = env.from_string(template)

    def _encode(self, text: str) -> Any:
        # A long text goes through encode_batch: it releases the GIL while it works (encode does
        # not), so tokenizing it on a worker thread does not stall the event loop. Same ids either
        # way; a short one stays on encode (~40 us less per call).
        if len(text) > _GIL_FREE_CHARS:
            return self._tok.encode_batch([text], add_special_tokens=False)[0]
        return self._tok.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Plain text to ids, with no special tokens added (the prompt structure is ours)."""
        return list(self._encode(text).ids)

    def encode_offsets(self, text: str, known_prefix: int = 0) -> tuple[list[int], list[int]]:
        """Ids (as `encode`) and where each token's text ends in `text` (characters, nondecreasing;
        the tokens of one multi-byte character all end after it).

        `known_prefix`: text[:known_prefix] is text that will begin other texts too (a template's
        constant text, e.g. a 4,000-character system prompt before each user's query). Its stable
        tokens (stable_len) are cached, and only the text from where they end is tokenized: the
        same ids and ends as tokenizing the whole text, for a tokenizer whose pre-tokenization
        resumes at a pre-token boundary as if the text began there (byte-level BPE without a
        prefix space and without a normalizer; any other tokenizes the whole text).

        Without a known prefix, a text as long as that is matched against recently tokenized ones
        (recent.py): a plain request's system prompt is tokenized once, not with every request."""
        if not self._resumable:
            return self._encode_whole(text)
        if _PREFIX_MIN_CHARS <= known_prefix <= min(len(text), _PREFIX_MAX_CHARS):
            ids, ends, cut = self._prefix_tokens(text[:known_prefix])
            rest_ids, rest_ends = self._encode_whole(text[cut:])
            return ids + rest_ids, ends + [cut + end for end in rest_ends]
        if len(text) >= _PREFIX_MIN_CHARS:
            return self._recent.encode_offsets(text, self._encode_whole)
        return self._encode_whole(text)

    def _encode_whole(self, text: str) -> tuple[list[int], list[int]]:
        enc = self._encode(text)
        return list(enc.ids), [end for _, end in enc.offsets]

    def _stable_prefix_tokens(self, prefix: str) -> tuple[list[int], list[int], int]:
        """The tokens of `prefix` that no continuation changes, their ends, and where they end."""
        ids, ends = self._encode_whole(prefix)
        k, cut = stable_head(ends, self.stable_len(prefix))
        return ids[:k], ends[:k], cut

    def stable_len(self, text: str, end: int | None = None) -> int:
        """The longest prefix of text[:end], in characters, whose tokens no continuation can change:
        for any `more`, the tokens of encode(text[:end] + more) that end within it are those of
        encode(text[:end]) that do.

        BPE never merges across pre-token boundaries, so it ends where the pre-tokens that may still
        change begin: the last one (a word may go on; a run of spaces gives its last space to the
        next word), an apostrophe that may begin a contraction, and a prefix of an added token at
        the end, with the last pre-token before it: an added token splits the text, so what precedes
        it is pre-tokenized as a text that ends there ("2  <|im_start|>" keeps its two spaces as one
        pre-token; "2  <|im_st" gives the second to "<|"). Without a pre-tokenizer it is 0: nothing
        is known to be stable."""
        end = len(text) if end is None else end
        pre = self._tok.pre_tokenizer
        if pre is None or end == 0:
            return 0
        cut = self._pre_token_cut(pre, text, end)
        for content in self._added:  # "...<|im_" may yet become <|im_end|>: the longest such tail
            i = text.find(content[0], max(0, end - len(content) + 1), end)
            while i != -1 and not text.startswith(content[: end - i], i):
                i = text.find(content[0], i + 1, end)
            if i != -1:
                cut = min(cut, self._pre_token_cut(pre, text, i))
        return cut

    def _pre_token_cut(self, pre: Any, text: str, end: int) -> int:
        """Start of the first pre-token of text[:end] that may change (see stable_len). Pre-tokenizes
        a tail window; its first pre-token may be cut short by the window, so it is never trusted."""
        window = _WINDOW
        while True:
            begin = max(0, end - window)
            spans = [span for _, span in pre.pre_tokenize_str(text[begin:end])]
            trusted = spans if begin == 0 else spans[2:]  # spans[1] starts where a cut-short spans[0] ended
            for start, stop in trusted:
                if begin + stop >= end or (begin + start > end - _CONTRACTION_LEN and text[begin + start] in "'’"):
                    return begin + start
            if begin == 0:
                return 0
            window *= 2

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render chat messages with the model's own template (as transformers would). `tools`
        (OpenAI's function specs): given to a template that knows tools; otherwise described in
        the system message, with tool calls and results as text (tools.plain_messages).
        ChatTemplateError when the template refuses the messages."""
        uses_tools = tools is not None or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if uses_tools and not self.template_knows_tools:
            messages, tools = plain_messages(messages, tools), None
        if self._chat_template is None:
            # A model without a template: a plain transcript is the honest fallback.
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            return "\n".join(lines) + ("\nassistant:" if add_generation_prompt else "")
        try:
            return self._chat_template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **({"tools": tools} if tools else {}),
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None


def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return str(tok.get("content"))
    return None if tok is None else str(tok)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Holds back text while the tail is an incomplete UTF-8 sequence (decoded as U+FFFD).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # ids before this index are settled text
        self._read_offset = 0  # text of ids[prefix_offset:read_offset] was already emitted
        self.text = ""

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], self._skip)
        full = decode(self._ids[self._prefix_offset :], self._skip)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta


def _resumes_at_pre_token_boundaries(spec: dict[str, Any]) -> bool:
    """Whether tokenizing text[cut:] gives the tokens of the whole text after `cut`, for any cut
    where a pre-token begins: no normalizer (one may join characters across the cut), and a
    byte-level pre-tokenizer that adds no prefix space and splits with GPT-2's regex (which looks
    behind nothing) or none."""
    pre = spec.get("pre_tokenizer") or {}
    return spec.get("normalizer") is None and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
