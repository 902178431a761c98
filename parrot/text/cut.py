"""Cutting a generation's tokens back to the text it reports (a stop string taken out).

A stop string may begin inside a token, or span several. The engine API's contract (see
`TokenEvent.output_token_ids`) is that a context holds exactly an output's reported text, so every
engine cuts the same way: keep the tokens whose text lies wholly inside the reported text, then
re-tokenize the characters of the reported text that were in the first cut token.
"""

from __future__ import annotations

from collections.abc import Sequence

from parrot.text.tokenizer import Tokenizer


def cut_to_text(tokenizer: Tokenizer, token_ids: Sequence[int], text: str) -> tuple[int, list[int]]:
    """(num_kept, tail_ids): `token_ids[:num_kept] + tail_ids` decodes to `text`, where `text` is a
    prefix of what `token_ids` decode to. `num_kept` is the longest prefix whose text ends on a whole
    character within `text`; `tail_ids` tokenize the rest of `text` (empty when it ends on a token
    boundary). Decodes a few times, walking back from the end: call it once per generation."""
    num_kept = len(token_ids)
    head = ""
    while num_kept > 0:
        head = tokenizer.decode(token_ids[:num_kept])
        if text.startswith(head) and not head.endswith("\ufffd"):
            break
        num_kept -= 1
    else:
        head = ""
    rest = text[len(head) :]
    return num_kept, tokenizer.encode(rest) if rest else []
