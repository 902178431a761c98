"""Semantic functions: prompt templates declared in Python, called like functions, never rendered here.

    @semantic_function(model=None)
    def joke(topic: Input, joke: Output = Output(max_tokens=40, stop=["\\n"]), explanation: Output = Output()):
        \"\"\"Tell a joke about {{input:topic}}.
        Joke:{{output:joke}}
        Explanation:{{output:explanation}}\"\"\"

    j, e = joke("cats")            # returns SemanticVariables at once; the call is queued
    j, e = joke.with_sampling(temperature=0.7, outputs={"joke": {"max_tokens": 20}})("dogs")

Parameters annotated `Output` (or defaulting to an `Output(...)`) are outputs, every other parameter
is an input; they must match the template's placeholders exactly. An input takes a SemanticVariable
of the same session, a plain value (sent inline), text with variables in it (`f"Title: {title}"`)
or a list (numbered lines, or as its `Input(...)` says: inputs.py); an output may be given an
existing, unset variable to write. One output returns one variable, several return a tuple in
parameter order; `fn.samples(n, ...)` makes n calls sharing one filled prompt and returns a list.
Outputs may be constrained (regex, choices, a JSON schema) and typed (outputs.py).

A chat model's prompt is written as roles, never as its chat markers: `@semantic_function(chat=True)`
with `system:` / `user:` / `assistant:` lines in the docstring, or a list of messages as the
template; the manager applies the model's own chat template (chat.py).

Sampling settings merge in layers (sampling.py): the function's `sampling=`, then each output's
`Output(...)`, then a call's `with_sampling(...)`; each level overrides only the fields it sets.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from parrot.frontend.chat import as_messages, docstring_messages
from parrot.frontend.core import SessionCore, current_core
from parrot.frontend.inputs import Input, Part, bind_chat_inputs, bind_inputs, parts_of
from parrot.frontend.outputs import Output, check_one_constraint, named
from parrot.frontend.sampling import SamplingLike, Settings, merge, settings_of
from parrot.frontend.transport import ApiTransport
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.chat import ParsedChat, parse_chat
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import MAX_BATCH_CALLS, MAX_GET_TIMEOUT_S, Binding, CallSpec, ChatMessage, RunRequest
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate, parse_template

__all__ = ["Input", "Output", "SemanticFunction", "current_session_core", "semantic_function"]


def current_session_core() -> SessionCore:
    core = current_core.get()
    if core is None:
        raise RuntimeError(
            "no Parrot session is active: call inside `with Session(...)` / `async with AsyncSession(...)`"
        )
    return core


class SemanticFunction:
    def __init__(
        self,
        name: str,
        template: str | Sequence[ChatMessage | tuple[str, str]],
        inputs: Sequence[str],
        outputs: Mapping[str, Output | SamplingLike | None],
        sampling: SamplingLike | None = None,
        model: str | None = None,
        input_styles: Mapping[str, Input] | None = None,
    ) -> None:
        """`template`: template text, or chat messages (chat.py: the manager renders them with the
        model's chat template)."""
        self.name = name
        self.template: str | None = None
        self.messages: list[ChatMessage] | None = None
        self._parsed: ParsedTemplate | ParsedChat
        parsed: ParsedTemplate | ParsedChat
        if isinstance(template, str):
            self.template = template
            self._parsed = parsed = parse_template(template, field=f"{name}.template")
        else:
            self.messages = as_messages(template, f"{name}.messages")
            self._parsed = parsed = parse_chat([(m.role, m.content) for m in self.messages], f"{name}.messages")
        if set(parsed.input_names) != set(inputs):
            raise ParrotError(
                f"{name}: the template's inputs {sorted(parsed.input_names)} do not match the parameters "
                f"{sorted(inputs)}",
                field=name,
            )
        if set(parsed.output_names) != set(outputs):
            raise ParrotError(
                f"{name}: the template's outputs {sorted(parsed.output_names)} do not match the Output "
                f"parameters {sorted(outputs)}",
                field=name,
            )
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._input_styles = {n: (input_styles or {}).get(n) or Input() for n in self.inputs}  # how lists render
        self._parsers = {
            out: named(setting.parse, out)
            for out, setting in outputs.items()
            if isinstance(setting, Output) and setting.parse is not None
        }
        # The sampling levels, lowest first (see sampling.py); `with_sampling` adds the call's.
        self._function_settings = settings_of(sampling, f"{self.name}.sampling")
        self._output_settings = {
            out: setting.settings if isinstance(setting, Output) else settings_of(setting, f"{self.name}.{out}")
            for out, setting in outputs.items()
        }
        self._call_settings: Settings = {}
        self._call_output_settings: dict[str, Settings] = {}
        self.model = model

    @property
    def default_sampling(self) -> SamplingParams:
        """The function's settings with the call's overrides for every output."""
        return merge(self._function_settings, self._call_settings)

    @property
    def sampling(self) -> dict[str, SamplingParams]:
        """Each output's settings: function, `Output(...)`, the call's, the call's for that output."""
        merged = {}
        for out in self.outputs:
            levels = [self._function_settings, self._output_settings[out], self._call_settings]
            levels.append(self._call_output_settings.get(out, {}))
            check_one_constraint({k: v for level in levels for k, v in level.items()}, f"{self.name}.{out}")
            merged[out] = merge(*levels)
        return merged

    def with_sampling(self, *, outputs: Mapping[str, SamplingLike] | None = None, **settings: Any) -> SemanticFunction:
        """This function with sampling overrides for the calls made through it, above every other
        level: `settings` (SamplingParams fields) for every output, `outputs` per output name.

            summarize.with_sampling(temperature=0.7)(chunk)
            joke.with_sampling(outputs={"joke": {"max_tokens": 20}})("cats")

        The template's parameters are untouched (no name can collide). Raises ParrotError naming
        an unknown output, an unknown setting or an invalid value."""
        unknown = sorted(set(outputs or {}) - set(self.outputs))
        if unknown:
            raise ParrotError(
                f"{self.name}.with_sampling: no output {unknown[0]!r} (the outputs: {self.outputs})",
                field=f"outputs.{unknown[0]}",
            )
        bound = copy.copy(self)
        bound._call_settings = {**self._call_settings, **settings_of(settings, f"{self.name}.with_sampling")}
        bound._call_output_settings = dict(self._call_output_settings)
        for out, value in (outputs or {}).items():
            extra = settings_of(value, f"{self.name}.with_sampling.outputs.{out}")
            bound._call_output_settings[out] = {**self._call_output_settings.get(out, {}), **extra}
        return bound

    def __repr__(self) -> str:
        return f"SemanticFunction({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the call in the active session; returns its output variable(s) at once."""
        return self.invoke(current_session_core(), *args, **kwargs)

    def samples(self, n: int, *args: Any, **kwargs: Any) -> list[Any]:
        """`n` calls with the same inputs, submitted in one batch: a list of `n` results (each what
        one call returns). They share one prompt: the manager fills it once and forks it for each
        call (prefix sharing). With a `seed`, sample i uses seed + i, so the samples differ and
        each is reproducible; sample at a temperature above 0 for different texts."""
        if not isinstance(n, int) or not 1 <= n <= MAX_BATCH_CALLS:
            raise ParrotError(f"{self.name}.samples: n must be 1..{MAX_BATCH_CALLS}, not {n!r}", field="n")
        given_outputs = sorted(set(kwargs) & set(self.outputs))
        if given_outputs:
            raise TypeError(f"{self.name}.samples() makes its own outputs; got {given_outputs[0]!r}")
        core = current_session_core()
        calls = [self._prepare(core, args, kwargs, seed_offset=i) for i in range(n)]
        core.submit_calls(calls)
        return [outs[0] if len(outs) == 1 else tuple(outs) for _, outs in calls]

    async def arun(
        self,
        base_url: str,
        *args: Any,
        api_key: str | None = None,
        criteria: Criteria | str = Criteria.LATENCY,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """One call in a session of its own, in one request (`POST /v1/run`): its output value(s),
        parsed as `get` would (a tuple for several outputs). For a one-call application (each
        request of a GPTs-like service): a session costs three requests (create with the call, get,
        delete). Inputs are values, not variables of a session; raises the output's ParrotError,
        ParrotError(408) when not done within `timeout` seconds (the call is then cancelled)."""
        if timeout is not None and not 0 < timeout <= MAX_GET_TIMEOUT_S:
            message = f"timeout must be in (0, {MAX_GET_TIMEOUT_S:g}] seconds, not {timeout!r}"
            raise ParrotError(message, field="timeout")
        transport = ApiTransport(base_url)
        core = SessionCore(transport, asyncio.get_running_loop(), api_key=api_key)
        try:
            try:
                result = self.invoke(core, *args, **kwargs)
            finally:  # what was queued goes in the run or nowhere: never by the core's flusher
                batch = core.take_batch()
            outs: list[SemanticVariable] = list(result) if isinstance(result, tuple) else [result]
            req = RunRequest(
                submit=batch,
                outputs=[v.var_id for v in outs],
                criteria=Criteria(criteria),
                timeout_s=MAX_GET_TIMEOUT_S if timeout is None else timeout,
            )
            answer = await transport.run(api_key, req)
        finally:
            await transport.aclose()
        values = [var.parsed(got.value or "") for var, got in zip(outs, answer.values, strict=True)]
        return tuple(values) if isinstance(result, tuple) else values[0]

    def invoke(self, core: SessionCore, *args: Any, **kwargs: Any) -> Any:
        spec, out_vars = self._prepare(core, args, kwargs)
        core.submit_call(spec, out_vars)
        return out_vars[0] if len(out_vars) == 1 else tuple(out_vars)

    def _prepare(
        self, core: SessionCore, args: Sequence[Any], kwargs: Mapping[str, Any], seed_offset: int = 0
    ) -> tuple[CallSpec, list[SemanticVariable]]:
        """The call's spec and its output variables (created, not yet submitted)."""
        if len(args) > len(self.inputs):
            raise TypeError(f"{self.name}() takes {len(self.inputs)} positional inputs, got {len(args)}")
        given: dict[str, Any] = dict(zip(self.inputs, args, strict=False))
        for key, value in kwargs.items():
            if key in given:
                raise TypeError(f"{self.name}() got two values for {key!r}")
            if key not in self.inputs and key not in self.outputs:
                raise TypeError(f"{self.name}() has no parameter {key!r}")
            given[key] = value
        missing = [n for n in self.inputs if n not in given]
        if missing:
            raise TypeError(f"{self.name}() is missing inputs {missing}")
        parts: dict[str, list[Part]] = {}
        for name in self.inputs:
            if isinstance(given[name], SemanticVariable):
                _check_same_session(given[name], core, name)
            parts[name] = parts_of(given[name], self._input_styles[name], f"{self.name}(): input {name!r}")
        template: str | None = None
        messages: list[ChatMessage] | None = None
        if isinstance(self._parsed, ParsedChat):
            assert self.messages is not None
            where = f"{self.name}.messages"
            messages, bindings = bind_chat_inputs(self._parsed, self.messages, parts, core.key, where)
        else:
            assert self.template is not None
            template, bindings = bind_inputs(self.template, self._parsed, parts, core.key, f"{self.name}.template")
        sampling = self.sampling
        if seed_offset:
            sampling = {
                out: s if s.seed is None else s.model_copy(update={"seed": (s.seed + seed_offset) % 2**63})
                for out, s in sampling.items()
            }
        out_vars: list[SemanticVariable] = []
        for name in self.outputs:
            var = given.get(name)
            if var is None:
                var = core.new_variable(name)
            elif not isinstance(var, SemanticVariable):
                raise TypeError(f"{self.name}(): output {name!r} takes a SemanticVariable to write, not {type(var)}")
            else:
                _check_same_session(var, core, name)
            var._parse = self._parsers.get(name)
            bindings[name] = Binding(var_id=var.var_id)
            out_vars.append(var)
        spec = CallSpec(
            template=template,
            messages=messages,
            bindings=bindings,
            sampling=sampling,
            default_sampling=self.default_sampling,
            model=self.model,
            name=self.name,
        )
        return spec, out_vars


def _check_same_session(var: SemanticVariable, core: SessionCore, name: str) -> None:
    if var._core is not core:
        raise ParrotError(f"{name!r}: the variable {var.var_id!r} belongs to another session", field=name)


@overload
def semantic_function(fn: Callable[..., Any], /) -> SemanticFunction: ...


@overload
def semantic_function(
    *,
    template: str | Sequence[ChatMessage | tuple[str, str]] | None = None,
    chat: bool = False,
    sampling: SamplingLike | None = None,
    model: str | None = None,
) -> Callable[[Callable[..., Any]], SemanticFunction]: ...


def semantic_function(
    fn: Callable[..., Any] | None = None,
    *,
    template: str | Sequence[ChatMessage | tuple[str, str]] | None = None,
    chat: bool = False,
    sampling: SamplingLike | None = None,
    model: str | None = None,
) -> SemanticFunction | Callable[[Callable[..., Any]], SemanticFunction]:
    """Declare a semantic function from a Python signature; the template is `template` (text or chat
    messages) or the docstring (dedented). `chat=True`: the docstring is chat messages, each begun
    by a `system:`, `user:` or `assistant:` line (chat.py), rendered by the manager with the
    model's own chat template. `sampling`: the defaults of every output (a SamplingParams or a
    mapping of its fields). The body is never run."""

    def wrap(f: Callable[..., Any]) -> SemanticFunction:
        text: str | Sequence[ChatMessage | tuple[str, str]]
        text = template if template is not None else inspect.cleandoc(f.__doc__ or "")
        if not text:
            raise ParrotError(f"{f.__name__}: no template (give a docstring or template=...)", field=f.__name__)
        if chat and isinstance(text, str):
            text = docstring_messages(text, f"{f.__name__}.__doc__")
        try:
            sig = inspect.signature(f, eval_str=True)
        except (NameError, TypeError):
            sig = inspect.signature(f)
        inputs: list[str] = []
        styles: dict[str, Input] = {}
        outputs: dict[str, Output | None] = {}
        for param in sig.parameters.values():
            annotation = param.annotation
            is_output = annotation is Output or isinstance(param.default, Output)
            is_output = is_output or (isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "Output")
            if is_output:
                outputs[param.name] = param.default if isinstance(param.default, Output) else None
            else:
                inputs.append(param.name)
                if isinstance(param.default, Input):
                    styles[param.name] = param.default
        return SemanticFunction(f.__name__, text, inputs, outputs, sampling, model, styles)

    return wrap(fn) if fn is not None else wrap
