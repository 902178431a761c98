"""Render a semantic call into token ids, piece by piece (the paper's prompt structure).

Constant text and each variable value are tokenized separately and concatenated, so a piece's
tokens do not depend on its neighbours: the same template prefix always yields the same ids, which
is what makes prefixes shareable at variable boundaries. contexts.prompt_points hashes the lists
built here into prefix points (policy/prefix.py): one at each piece boundary (for a plain request,
at chat-message and token-block boundaries).
"""

from __future__ import annotations

from collections.abc import Mapping

from parrot.protocol.errors import ParrotError
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.variable import Variable
from parrot.text import Tokenizer


def text_piece_token_ids(template: ParsedTemplate, tokenizer: Tokenizer) -> list[list[int] | None]:
    """Token ids of each text piece, None for placeholders (one batched tokenizer call)."""
    texts = [p.text for p in template.pieces if isinstance(p, TextPiece)]
    encoded = iter(tokenizer.encode_batch(texts)) if texts else iter(())
    return [next(encoded) if isinstance(p, TextPiece) else None for p in template.pieces]


def value_token_ids(var: Variable, tokenizer: Tokenizer) -> list[int]:
    assert var.value is not None
    key = id(tokenizer)
    ids = var.token_ids.get(key)
    if ids is None:
        ids = var.token_ids[key] = tokenizer.encode(var.value)
    return ids


def pieces_token_ids(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, start: int, stop: int
) -> list[int]:
    """The ids of pieces[start:stop]; every placeholder there must be a set input."""
    out: list[int] = []
    for i in range(start, stop):
        piece = call.template.pieces[i]
        if isinstance(piece, TextPiece):
            text_ids = call.piece_token_ids[i]
            assert text_ids is not None
            out.extend(text_ids)
        else:
            assert piece.kind is PlaceholderKind.INPUT
            out.extend(value_token_ids(variables[call.inputs[piece.name]], tokenizer))
    return out


def stages(template: ParsedTemplate) -> list[tuple[int, int, str]]:
    """(start, stop, output): fill pieces[start:stop], then generate `output`; in prompt order."""
    out: list[tuple[int, int, str]] = []
    start = 0
    for i, piece in enumerate(template.pieces):
        if isinstance(piece, Placeholder) and piece.kind is PlaceholderKind.OUTPUT:
            out.append((start, i, piece.name))
            start = i + 1
    return out


def check_prompt_len(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, max_model_len: int, field: str
) -> int:
    """Known prompt tokens + every output's max_tokens must fit the model; returns the known tokens.

    At submit only the text and the set inputs count; at run time everything is known.
    """
    num_prompt_tokens = 0
    for i, piece in enumerate(call.template.pieces):
        if isinstance(piece, TextPiece):
            num_prompt_tokens += len(call.piece_token_ids[i] or ())
        elif piece.kind is PlaceholderKind.INPUT:
            var = variables[call.inputs[piece.name]]
            if var.value is not None:
                num_prompt_tokens += len(value_token_ids(var, tokenizer))
    num_output_tokens = sum(s.max_tokens for s in call.sampling.values())
    if num_prompt_tokens + num_output_tokens > max_model_len:
        raise ParrotError(
            f"call {call.call_id}: {num_prompt_tokens} prompt tokens + {num_output_tokens} max_tokens of its outputs "
            f"exceed the model's context of {max_model_len} tokens",
            field=field,
        )
    return num_prompt_tokens
