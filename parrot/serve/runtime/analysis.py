"""DAG analysis: pure readiness queries on a call and its variables, read when views.py builds
the call's view for the policy.

Nothing here mutates state or talks to an engine. The rest of the DAG analysis, objective deduction
and task groups, is pure too: policy/objectives.py, applied to a session by deduction.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from parrot.protocol.template import Placeholder, PlaceholderKind, TextPiece
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.variable import Variable


def num_ready_pieces(call: CallNode, variables: Mapping[str, Variable]) -> int:
    """How many leading pieces before the first output have known content (text, or a set input).

    These may be filled into the engine before the call's other inputs arrive (pipelining): their
    rendered text's stable tokens (render.render_prompt), since the tokens at its end may yet merge
    with what follows.
    """
    pieces = call.template.pieces
    for i, piece in enumerate(pieces):
        if isinstance(piece, TextPiece):
            continue
        if piece.kind is PlaceholderKind.OUTPUT or variables[call.inputs[piece.name]].value is None:
            return i
    raise AssertionError("a parsed template ends with an output")


def inputs_ready(call: CallNode, variables: Mapping[str, Variable]) -> bool:
    return all(variables[v].value is not None for v in call.inputs.values())


def failed_input(call: CallNode, variables: Mapping[str, Variable]) -> Variable | None:
    """The first input (in prompt order) that failed, if any: the call cannot run."""
    for piece in call.template.pieces:
        if isinstance(piece, Placeholder) and piece.kind is PlaceholderKind.INPUT:
            var = variables[call.inputs[piece.name]]
            if var.error is not None:
                return var
    return None
