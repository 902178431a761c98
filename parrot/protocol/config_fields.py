"""Config fields that carry their documentation and bounds as data.

`EngineConfig`, `ManagerConfig` and its sections declare each field with `setting(default, doc)`:
the one-line doc (units in the field's name or in the doc), and the bound a number must pass.
`check_bounds` applies the bounds once, in the config's `__post_init__`; `parrot.cli` derives every
flag, config-file key and the operator guide's configuration reference from the same fields, so the
documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class SettingError(ValueError):
    """A setting's value is not allowed. `field` is its path within its config
    (`scheduling.tpot_target_ms`, or `block_size` in a config without sections)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def setting(default: Any, doc: str, *, gt: float | None = None, ge: float | None = None) -> Any:
    """A field with its default, its one-line doc, and a bound its value (when not None) must pass:
    greater than `gt`, or at least `ge`."""
    return dataclasses.field(default=default, metadata={"doc": doc, "gt": gt, "ge": ge})


def doc_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("doc", ""))


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def bound_of(f: dataclasses.Field[Any]) -> str:
    """The field's bound as text ("> 0", ">= 1"), or "" when it has none."""
    gt, ge = f.metadata.get("gt"), f.metadata.get("ge")
    return f"> {gt:g}" if gt is not None else f">= {ge:g}" if ge is not None else ""


def check_bounds(config: Any, prefix: str = "") -> None:
    """Every field's bound, checked; a SettingError names the field as `prefix + name`."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        path = prefix + f.name
        gt, ge = f.metadata.get("gt"), f.metadata.get("ge")
        if gt is not None and not value > gt:
            raise SettingError(f"{path} must be > {gt:g}", field=path)
        if ge is not None and not value >= ge:
            raise SettingError(f"{path} must be >= {ge:g}", field=path)
