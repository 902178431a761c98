"""The session DAG: semantic calls and Semantic Variables as nodes, producer/consumer edges.

Owned by one session; mutated only on the manager's event loop. A batch of new variables and calls
is first *staged* (checked against the graph, nothing changes; any fault raises ParrotError naming
the field) and then *committed*, so a bad request leaves the graph as it was. The graph stays
acyclic: staging rejects a batch that would close a cycle.

Id spaces: client-chosen variable ids match public_api.ID_PATTERN, which has no `~`; ids the
manager makes (`v~7`, `c3~joke`) contain `~`, so the two never collide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parrot.protocol.errors import ParrotError, conflict, not_found
from parrot.protocol.public_api import CallSpec, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate
from parrot.serve.runtime.variable import Variable

if TYPE_CHECKING:
    from parrot.serve.policy.prefix import PrefixPoint


@dataclass(frozen=True, slots=True)
class Encoded:
    """A run of known pieces rendered as one string and tokenized (render.encode_run)."""

    text: str
    token_ids: list[int]
    token_ends: list[int]  # where each token's text ends in `text` (empty: tokens given by the client)
    piece_ends: list[int]  # where each piece's text ends in `text`


class CallNode:
    """A semantic call's structure, fixed at commit; its run state is its `CallRun` (call_run.py)."""

    def __init__(
        self,
        call_id: str,
        template: ParsedTemplate,
        inputs: dict[str, str],
        outputs: dict[str, str],
        sampling: dict[str, SamplingParams],
        model: str,
        name: str | None = None,
    ) -> None:
        self.call_id = call_id
        self.template = template
        self.inputs = inputs  # placeholder name -> var_id
        self.outputs = outputs  # output name -> var_id, in prompt order
        self.sampling = sampling  # output name -> settings (every output has one)
        self.model = model
        self.name = name
        # Plain requests sent as token ids: the one text piece's tokens, filled as given (never
        # re-tokenized). Set by the manager between stage and commit, fixed after.
        self.prompt_token_ids: list[int] | None = None
        # Its prompt tokens known at submit plus its outputs' max_tokens (the tenant's tokens in flight).
        self.num_tokens = 0
        # A cache (render.encode_run): (id(tokenizer), start) -> (stop, the rendered pieces[start:stop]
        # tokenized). Values never change once set, so an entry stays valid; the runner clears it.
        self.encodings: dict[tuple[int, int], tuple[int, Encoded]] = {}
        # A cache (contexts.prompt_points): (id(tokenizer), stop, block tokens) -> the tokens of
        # pieces[:stop] and their prefix points; computed at submit on the worker thread that
        # tokenizes the batch, so rebuilding the call's view on the event loop costs a lookup.
        self.points: dict[tuple[int, int, int], tuple[list[int], tuple[PrefixPoint, ...]]] = {}
        # Plain requests: token positions in the single text piece where chat messages end (prefix
        # points, prefix.py); None for semantic calls, whose points are the piece boundaries.
        self.message_boundaries: tuple[int, ...] | None = None

    @property
    def input_var_ids(self) -> list[str]:
        return list(dict.fromkeys(self.inputs.values()))


@dataclass
class StagedBatch:
    """New nodes and edges, checked but not yet part of the graph."""

    variables: list[Variable] = field(default_factory=list)  # created by the batch's variables list
    inline_variables: list[Variable] = field(default_factory=list)  # inline values and unbound outputs
    calls: list[CallNode] = field(default_factory=list)
    num_chars: int = 0  # the text it stores (templates, values): counted against the session's limit
    points_block_tokens: int | None = None  # with prefix sharing: compute the calls' prefix points at submit


class SessionGraph:
    def __init__(self) -> None:
        self.variables: dict[str, Variable] = {}
        self.calls: dict[str, CallNode] = {}
        self._num_generated_var_ids = 0

    def stage(
        self,
        var_specs: Sequence[VariableSpec],
        calls: Sequence[tuple[CallSpec, ParsedTemplate, str]],
        call_field_prefix: str = "calls",
    ) -> StagedBatch:
        """Check a batch (specs, each call with its parsed template and resolved model); change nothing."""
        staged = StagedBatch()
        new_vars: dict[str, Variable] = {}
        num_generated = self._num_generated_var_ids
        for i, vspec in enumerate(var_specs):
            var_id = vspec.var_id
            if var_id is None:
                var_id, num_generated = f"v~{num_generated}", num_generated + 1
            if var_id in self.variables or var_id in new_vars:
                raise conflict(f"variable {var_id!r} already exists in this session", field=f"variables[{i}].var_id")
            var = Variable(var_id, vspec.name)
            if vspec.value is not None:
                var.set(vspec.value)
            new_vars[var_id] = var
            staged.variables.append(var)

        def lookup(var_id: str) -> Variable | None:
            return new_vars.get(var_id) or self.variables.get(var_id)

        new_producers: dict[str, str] = {}  # var_id -> staged call_id
        new_consumers: dict[str, list[str]] = {}  # var_id -> staged call_ids
        for j, (spec, template, model) in enumerate(calls):
            call_id = f"c{len(self.calls) + j}"
            where = f"{call_field_prefix}[{j}]" if call_field_prefix else ""
            at = (where + ".") if where else ""
            names = set(template.input_names) | set(template.output_names)
            for name in spec.bindings:
                if name not in names:
                    raise ParrotError(
                        f"binding {name!r} names no placeholder of the template (placeholders: {sorted(names)})",
                        field=f"{at}bindings.{name}",
                    )
            for name in spec.sampling:
                if name not in template.output_names:
                    raise ParrotError(f"sampling for {name!r}, which is not an output", field=f"{at}sampling.{name}")
            inputs: dict[str, str] = {}
            for name in template.input_names:
                binding = spec.bindings.get(name)
                if binding is None:
                    raise ParrotError(f"input placeholder {name!r} has no binding", field=f"{at}bindings.{name}")
                if binding.value is not None:
                    var = Variable(f"{call_id}~{name}", name)
                    var.set(binding.value)
                    new_vars[var.var_id] = var
                    staged.inline_variables.append(var)
                else:
                    assert binding.var_id is not None  # Binding checks exactly one is given
                    found = lookup(binding.var_id)
                    if found is None:
                        raise not_found("variable", binding.var_id, field=f"{at}bindings.{name}.var_id")
                    var = found
                inputs[name] = var.var_id
                new_consumers.setdefault(var.var_id, []).append(call_id)
            outputs: dict[str, str] = {}
            for name in template.output_names:
                binding = spec.bindings.get(name)
                if binding is None:
                    var = Variable(f"{call_id}~{name}", name)
                    new_vars[var.var_id] = var
                    staged.inline_variables.append(var)
                else:
                    if binding.value is not None:
                        raise ParrotError(f"output {name!r} cannot take a value", field=f"{at}bindings.{name}.value")
                    assert binding.var_id is not None
                    found = lookup(binding.var_id)
                    field_ = f"{at}bindings.{name}.var_id"
                    if found is None:
                        raise not_found("variable", binding.var_id, field=field_)
                    if found.is_done:
                        raise conflict(f"output {name!r} is bound to {found.var_id!r}, which is already set", field_)
                    producer = found.producer_call_id or new_producers.get(found.var_id)
                    if producer is not None:
                        raise conflict(f"variable {found.var_id!r} is already the output of call {producer!r}", field_)
                    var = found
                outputs[name] = var.var_id
                new_producers[var.var_id] = call_id
            sampling = {name: spec.sampling.get(name, spec.default_sampling) for name in template.output_names}
            staged.calls.append(CallNode(call_id, template, inputs, outputs, sampling, model, spec.name))

        self._check_acyclic(staged.calls, new_consumers, call_field_prefix)
        return staged

    def commit(self, staged: StagedBatch) -> None:
        for var in staged.variables + staged.inline_variables:
            self.variables[var.var_id] = var
        for call in staged.calls:
            self.calls[call.call_id] = call
            for var_id in call.input_var_ids:
                self.variables[var_id].consumer_call_ids.append(call.call_id)
            for var_id in call.outputs.values():
                self.variables[var_id].producer_call_id = call.call_id
        self._num_generated_var_ids += sum(1 for v in staged.variables if v.var_id.startswith("v~"))

    def _check_acyclic(self, new_calls: list[CallNode], new_consumers: dict[str, list[str]], prefix: str) -> None:
        # The committed graph is acyclic, so a cycle passes through a new call: search from those.
        staged = {c.call_id: c for c in new_calls}

        def successors(call_id: str) -> list[str]:
            call = staged.get(call_id) or self.calls[call_id]
            out: list[str] = []
            for var_id in call.outputs.values():
                existing = self.variables.get(var_id)
                if existing is not None:
                    out.extend(existing.consumer_call_ids)
                out.extend(new_consumers.get(var_id, ()))
            return out

        color: dict[str, int] = {}  # 1: on the current path, 2: finished
        for start in staged:
            if start in color:
                continue
            path = [start]
            stack = [iter(successors(start))]
            color[start] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    color[path.pop()] = 2
                    stack.pop()
                elif color.get(nxt) == 1:
                    cycle = [*path[path.index(nxt) :], nxt]
                    j = new_calls.index(staged[start])
                    raise ParrotError(
                        f"dependency cycle through calls {' -> '.join(cycle)}",
                        field=f"{prefix}[{j}].bindings" if prefix else "bindings",
                    )
                elif nxt not in color:
                    color[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(successors(nxt)))
