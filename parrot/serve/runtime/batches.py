"""A submitted batch before it joins a session: parsed (templates; a chat-form call's messages
rendered with the model's chat template), staged (checked against the graph and the limits,
nothing changed), then tokenized (each call's known prompt, cached on the call; lengths checked),
then committed by the manager. Tokenizing touches only the staged calls, so the manager may run it
on a worker thread for a batch with much text."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import CallInfo, CallSpec, SubmitRequest, SubmitResponse, VariableSpec
from parrot.protocol.template import ParsedTemplate, parse_template
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.prefix import chat_message_boundaries
from parrot.serve.runtime.analysis import num_ready_pieces
from parrot.serve.runtime.chat import chat_template
from parrot.serve.runtime.contexts import prompt_points
from parrot.serve.runtime.engines import EnginePool
from parrot.serve.runtime.graph import StagedBatch
from parrot.serve.runtime.render import check_prompt_len, encode_run
from parrot.serve.runtime.session import Session
from parrot.serve.runtime.variable import Variable


def submitted(staged: StagedBatch) -> SubmitResponse:
    return SubmitResponse(
        variables=[v.info() for v in staged.variables],
        calls=[CallInfo(call_id=c.call_id, outputs=dict(c.outputs)) for c in staged.calls],
    )


def parse_calls(
    specs: Sequence[CallSpec], pool: EnginePool, call_field_prefix: str
) -> list[tuple[CallSpec, ParsedTemplate, str]]:
    """Each call with its parsed template and resolved model; a chat-form call's messages rendered
    with its model's own chat template (chat.py). ParrotError(400) naming the call's field."""
    parsed = []
    for j, spec in enumerate(specs):
        at = f"{call_field_prefix}[{j}]." if call_field_prefix else ""
        model = pool.resolve_model(spec.model, field=f"{at}model")
        if spec.template is not None:
            template = parse_template(spec.template, field=f"{at}template")
        else:
            assert spec.messages is not None
            template = chat_template(pool.for_model(model).tokenizer, spec.messages, f"{at}messages")
        parsed.append((spec, template, model))
    return parsed


def check_awaited(req: SubmitRequest, known: Mapping[str, Variable]) -> None:
    """400 naming `awaited` for an id that is neither the session's variable nor named by the batch."""
    if not req.awaited:
        return
    named = {v.var_id for v in req.variables} | {b.var_id for c in req.calls for b in c.bindings.values()}
    unknown = next((v for v in req.awaited if v not in known and v not in named), None)
    if unknown is not None:
        raise ParrotError(
            f"awaited: {unknown!r} is neither a variable of the session nor named by the batch", field="awaited"
        )


def batch_chars(var_specs: Sequence[VariableSpec], call_specs: Sequence[CallSpec]) -> int:
    """The text a batch carries: its templates and values, in characters."""
    values = sum(len(v.value or "") for v in var_specs)
    return values + sum(c.num_chars + sum(len(b.value or "") for b in c.bindings.values()) for c in call_specs)


def stage_batch(
    session: Session,
    var_specs: Sequence[VariableSpec],
    calls: Sequence[tuple[CallSpec, ParsedTemplate, str]],
    prefix: str,
    config: ManagerConfig,
) -> tuple[StagedBatch, Mapping[str, Variable]]:
    """Check a batch against the session (nothing changes) and within the limits."""
    graph = session.graph
    staged = graph.stage(var_specs, calls, prefix)
    num_variables = len(graph.variables) + len(staged.variables) + len(staged.inline_variables)
    if num_variables > config.limits.max_variables_per_session:
        raise ParrotError(
            f"the session would hold {num_variables} variables; the limit is {config.limits.max_variables_per_session}",
            status=413,
            field="variables",
        )
    num_calls = len(graph.calls) + len(staged.calls)
    if num_calls > config.limits.max_calls_per_session:
        raise ParrotError(
            f"the session would hold {num_calls} calls; the limit is {config.limits.max_calls_per_session}",
            status=413,
            field="calls",
        )
    staged.num_chars = batch_chars(var_specs, [spec for spec, _, _ in calls])
    staged.points_block_tokens = config.sharing.prefix_block_tokens if config.sharing.prefix_sharing else None
    session.check_chars(staged.num_chars, config.limits.max_chars_per_session, "calls" if calls else "variables")
    variables = collections.ChainMap({v.var_id: v for v in staged.variables + staged.inline_variables}, graph.variables)
    return staged, variables


def tokenize_batch(
    staged: StagedBatch,
    variables: Mapping[str, Variable],
    pool: EnginePool,
    prefix: str,
    message_prefix_ids: Sequence[list[int]] | None = None,
    prompt_token_ids: list[int] | None = None,
    shared_prompt: bool = False,
) -> None:
    """Tokenize the staged calls' known prompts (cached on each call) and check their lengths.
    Touches only the staged calls: safe on a worker thread. `shared_prompt`: the calls are forks of
    one plain prompt (OpenAI's `n`): a boundary one token before its end lets them share it all,
    each fork computing only the last token (the one it samples after)."""
    for j, call in enumerate(staged.calls):
        engine = pool.for_model(call.model)
        if prompt_token_ids is not None:  # a plain request given as tokens: its one text piece
            call.prompt_token_ids = list(prompt_token_ids)
        field = f"{prefix}[{j}].template" if prefix else "template"
        num_known = check_prompt_len(call, variables, engine.tokenizer, engine.max_model_len, field)
        call.num_tokens = num_known + sum(s.max_tokens for s in call.sampling.values())
        if message_prefix_ids is not None:  # a plain request: one text piece
            prompt_ids = encode_run(call, variables, engine.tokenizer, 0, 1).token_ids
            prefix_ids = list(message_prefix_ids)
            boundaries = [n for n, _ in chat_message_boundaries(prompt_ids, prefix_ids)]
            if shared_prompt and len(prompt_ids) > 1:
                boundaries.append(len(prompt_ids) - 1)
            call.message_boundaries = tuple(boundaries)
        num_ready = num_ready_pieces(call, variables)
        if staged.points_block_tokens is not None and num_ready > 0:  # here, not on the event loop
            prompt_points(call, variables, engine.tokenizer, num_ready, staged.points_block_tokens)
