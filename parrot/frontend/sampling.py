"""Sampling settings in layers: what each level of a semantic function sets, merged in one order.

Levels, lowest first: the function's defaults (`@semantic_function(sampling=...)`), each output's
`Output(...)`, then a call's overrides (`fn.with_sampling(...)`: every output, then per output).
A level overrides only the fields it sets explicitly (a SamplingParams' `model_fields_set`, a
mapping's keys); every other field comes from the level below, and SamplingParams' defaults
are the floor. Unknown fields and invalid values raise ParrotError naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from parrot.protocol.errors import ParrotError
from parrot.protocol.sampling import SamplingParams

Settings = dict[str, Any]  # field name -> value, only the fields one level sets
SamplingLike = SamplingParams | Mapping[str, Any]
FIELDS = tuple(SamplingParams.model_fields)


def settings_of(value: SamplingLike | None, where: str) -> Settings:
    """The fields `value` sets, checked; `where` names the level in errors (e.g. "joke.Output")."""
    if value is None:
        return {}
    if isinstance(value, SamplingParams):
        return {name: getattr(value, name) for name in value.model_fields_set}
    if not isinstance(value, Mapping):
        raise ParrotError(f"{where}: sampling takes a SamplingParams or a mapping, not {type(value)}", field=where)
    unknown = sorted(str(k) for k in value if k not in FIELDS)
    if unknown:
        raise ParrotError(
            f"{where}: unknown sampling setting {unknown[0]!r} (the settings: {', '.join(FIELDS)})",
            field=f"{where}.{unknown[0]}",
        )
    try:
        checked = SamplingParams(**value)
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "sampling"
        raise ParrotError(f"{where}: sampling setting {name!r}: {first['msg']}", field=f"{where}.{name}") from e
    return {name: getattr(checked, name) for name in value}


def merge(*levels: Settings) -> SamplingParams:
    """The settings of every level, a later level overriding the fields it sets."""
    merged: Settings = {}
    for level in levels:
        merged.update(level)
    return SamplingParams(**merged)
