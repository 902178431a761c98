"""Render a semantic call into token ids: the tokenizer's own ids for the rendered prompt.

The known pieces of a call (constant text and set input values; a value a producer generated is
text once set) are joined and tokenized as one string, never piece by piece, so a space before a
placeholder merges with the value's first word as in the rendered prompt: "Problem: {{input:p}}"
with "Plan..." gives `Problem`, `:`, `ĠPlan`, not `Ġ` + `Plan`. The rules:

- The prompt before the first output is encode(rendered text): exact.
- The text after an output, up to the next one, is tokenized on its own. The output's tokens are
  the sampled ones, already in the engine's context; merging the text after it with them would
  mean re-tokenizing generated text and refilling it, so that boundary is not exact.
- A known prefix whose rest is still missing (an early fill, a waiting call's prefix points) gives
  only its stable tokens (Tokenizer.stable_len): those no continuation can change.
- Semantic Variable boundaries in tokens (where contexts.prompt_points hashes prefix points, see
  policy/prefix.py): at each piece end b, the nearest token boundary at or before b (the tokens
  that end within text[:b]), and the stable boundary of text[:b] (a function of that text alone:
  the same for every call whose prompt agrees up to b, and where an early fill stopped).

Encodings are cached on the call (`CallNode.encodings`), one per run of known pieces: values
never change once set, so a run's text and tokens are fixed by where it stops.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from parrot.protocol.errors import ParrotError
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece
from parrot.serve.runtime.graph import CallNode, Encoded
from parrot.serve.runtime.variable import Variable
from parrot.text import Tokenizer


@dataclass(frozen=True, slots=True)
class Prompt:
    """The tokens of a call's prompt before its first output that may be filled now, and the
    Semantic Variable boundaries among them (token counts, sorted, each in 1..len(token_ids))."""

    token_ids: list[int]
    boundaries: list[int]


def piece_text(call: CallNode, variables: Mapping[str, Variable], i: int) -> str | None:
    """The text of piece i: constant text, or an input's value (None while unset or an output)."""
    piece = call.template.pieces[i]
    if isinstance(piece, TextPiece):
        return piece.text
    if piece.kind is PlaceholderKind.OUTPUT:
        return None
    return variables[call.inputs[piece.name]].value


def encode_run(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, start: int, stop: int
) -> Encoded:
    """pieces[start:stop] (all known) rendered as one string and tokenized; cached on the call."""
    key = (id(tokenizer), start)
    cached = call.encodings.get(key)
    if cached is not None and cached[0] == stop:
        return cached[1]
    texts = [piece_text(call, variables, i) for i in range(start, stop)]
    assert all(t is not None for t in texts), "encode_run over a piece that is not known"
    text = "".join(t or "" for t in texts)
    piece_ends = list(itertools.accumulate(len(t or "") for t in texts))
    if call.prompt_token_ids is not None:  # a plain request sent as tokens: filled as given
        encoded = Encoded(text, list(call.prompt_token_ids), [], piece_ends)
    else:
        # A template's leading constant text (a system prompt) begins every call of the template:
        # its tokens are cached by the tokenizer, only the rest is tokenized (the same ids).
        first = call.template.pieces[start]
        known = len(texts[0] or "") if start == 0 and stop > 1 and isinstance(first, TextPiece) else 0
        ids, ends = tokenizer.encode_offsets(text, known_prefix=known)
        encoded = Encoded(text, ids, ends, piece_ends)
    call.encodings[key] = (stop, encoded)
    return encoded


def render_prompt(call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, stop: int) -> Prompt:
    """The prompt of pieces[:stop] (all known; stop <= the first output): every token when `stop` is
    the first output, else the stable ones (the rest of the prompt is still missing)."""
    complete = stop == call.template.first_output_index
    enc = encode_run(call, variables, tokenizer, 0, stop)
    ids, ends = enc.token_ids, enc.token_ends
    if not ends:  # given as tokens: one piece, no offsets
        return Prompt(ids, [len(ids)] if ids else [])
    num_tokens = len(ids) if complete else bisect.bisect_right(ends, tokenizer.stable_len(enc.text))
    counts: set[int] = set()
    for b in enc.piece_ends:
        counts.add(bisect.bisect_right(ends, b))
        if b < len(enc.text) or not complete:
            counts.add(bisect.bisect_right(ends, tokenizer.stable_len(enc.text, b)))
    return Prompt(ids[:num_tokens], sorted(n for n in counts if 0 < n <= num_tokens))


def stages(template: ParsedTemplate) -> list[tuple[int, int, str]]:
    """(start, stop, output): fill pieces[start:stop], then generate `output`; in prompt order."""
    out: list[tuple[int, int, str]] = []
    start = 0
    for i, piece in enumerate(template.pieces):
        if isinstance(piece, Placeholder) and piece.kind is PlaceholderKind.OUTPUT:
            out.append((start, i, piece.name))
            start = i + 1
    return out


def segment_token_ids(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, start: int, stop: int
) -> list[int]:
    """The tokens of the text between two outputs, pieces[start:stop] (all known), on its own."""
    return encode_run(call, variables, tokenizer, start, stop).token_ids if stop > start else []


def check_prompt_len(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, max_model_len: int, field: str
) -> int:
    """Known prompt tokens + every output's max_tokens must fit the model; returns the known tokens.

    At submit only the runs of text and set inputs count (each tokenized whole); at run time
    everything is known and the count is exact.
    """
    num_prompt_tokens = 0
    start = 0
    num_pieces = len(call.template.pieces)
    for i in range(num_pieces + 1):
        if i < num_pieces and piece_text(call, variables, i) is not None:
            continue
        if i > start:
            num_prompt_tokens += len(encode_run(call, variables, tokenizer, start, i).token_ids)
        start = i + 1
    num_output_tokens = sum(s.max_tokens for s in call.sampling.values())
    if num_prompt_tokens + num_output_tokens > max_model_len:
        raise ParrotError(
            f"call {call.call_id}: {num_prompt_tokens} prompt tokens + {num_output_tokens} max_tokens of its outputs "
            f"exceed the model's context of {max_model_len} tokens",
            field=field,
        )
    return num_prompt_tokens
