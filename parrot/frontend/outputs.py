"""Outputs of a semantic function: their sampling settings, constraints, and typed values.

    Output(max_tokens=40, stop=["\\n"])          # sampling settings for this output
    Output(regex=r"\\d{4}-\\d{2}-\\d{2}")          # the text matches the regex
    select(["yes", "no"])                        # the text is exactly one of the options
    Output(schema={"type": "object", ...})       # JSON valid against the schema; get() -> parsed JSON
    Output(schema=Person)                        # a pydantic model class; get() -> a Person

The constraints travel as sampling settings (`regex`, `choices`, `json_schema`), which the engine
enforces while it samples; at most one per output. A typed output's variable still holds text on
the server (its consumers read the JSON); only the client's `get` parses it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from parrot.frontend.sampling import SamplingLike, Settings, settings_of
from parrot.protocol.errors import ParrotError

CONSTRAINTS = ("regex", "json_schema", "choices")
Parser = Callable[[str], Any]


class Output:
    """Marks a parameter as an output placeholder and carries its sampling settings.

    `Output(max_tokens=40, stop=["\\n"])` or `Output(SamplingParams(...))`: only the fields given
    override the function's `sampling=`; `Output()` takes the function's settings as they are.
    `schema`: a JSON schema (a mapping) or a pydantic model class; the output is constrained to it
    and its variable's `get` returns the parsed JSON, or the model instance.
    """

    def __init__(
        self,
        sampling: SamplingLike | None = None,
        *,
        schema: type[BaseModel] | Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        if sampling is not None and settings:
            raise TypeError("give either a SamplingParams or keyword settings, not both")
        check_one_constraint(settings, "Output")
        self.settings: Settings = settings_of(sampling if sampling is not None else settings, "Output")
        self.parse: Parser | None = None
        if schema is not None:
            if "json_schema" in self.settings:
                raise TypeError("give either schema= or json_schema=, not both")
            json_schema, self.parse = schema_parser(schema)
            self.settings.update(settings_of({"json_schema": json_schema}, "Output.schema"))
        check_one_constraint(self.settings, "Output")

    def __repr__(self) -> str:
        return f"Output({', '.join(f'{k}={v!r}' for k, v in self.settings.items())})"


def select(options: Sequence[str], scored: bool = True, **settings: Any) -> Output:
    """An output that is exactly one of `options`. `scored` (the default): the option the model
    finds most likely given the prompt, each scored as a fork of the filled prompt (one fill plus a
    short scoring fill per option, no generation); the variable's `scores` then hold every option's
    log-probability. `scored=False`: generated under the choices grammar (the first likely path)."""
    if isinstance(options, str) or not options or not all(isinstance(o, str) and o for o in options):
        raise ParrotError("select takes a list of non-empty strings", field="choices")
    return Output(choices=list(options), score_choices=scored, **settings)


def check_one_constraint(settings: Mapping[str, Any], where: str) -> None:
    given = [name for name in CONSTRAINTS if settings.get(name) is not None]
    if len(given) > 1:
        message = f"{where}: at most one of regex, json_schema, choices (got {given})"
        raise ParrotError(message, field=f"{where}.{given[1]}")


def schema_parser(schema: type[BaseModel] | Mapping[str, Any]) -> tuple[dict[str, Any], Parser]:
    """The JSON schema to constrain to, and the parser of the text the engine produced."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        model = schema

        def parse_model(text: str) -> Any:
            try:
                return model.model_validate(json.loads(text, strict=False))
            except (json.JSONDecodeError, ValidationError) as e:
                raise ParrotError(f"the output is not a valid {model.__name__}: {e}", status=502) from e

        return model.model_json_schema(), parse_model
    if isinstance(schema, Mapping):

        def parse_json(text: str) -> Any:
            try:
                return json.loads(text, strict=False)  # control characters in strings are tolerated
            except json.JSONDecodeError as e:
                raise ParrotError(f"the output is not JSON: {e}", status=502) from e

        return dict(schema), parse_json
    raise TypeError(f"schema takes a JSON schema (a mapping) or a pydantic model class, not {schema!r}")


def named(parse: Parser, var_name: str) -> Parser:
    """`parse` whose errors name the output."""

    def run(text: str) -> Any:
        try:
            return parse(text)
        except ParrotError as e:
            raise ParrotError(f"output {var_name!r}: {e.message}", status=e.status, field=var_name) from e

    return run
