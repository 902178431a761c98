"""`parrot serve` settings: every field of `ServeConfig`, `EngineConfig` and `ManagerConfig`'s
sections as a key of a config file (TOML or JSON) and as a flag, checked with errors that name the
key and the allowed values.

Precedence: the dataclasses' defaults, then the config file, then the command line. A config file
has these tables, each optional:

    [serve]               ServeConfig: host, port, builtin, engine_urls, openai_engines, ...
    [engine]              EngineConfig: model, dtype, max_num_batched_tokens, latency_max_batched_tokens, ...
    [manager.auth]        ManagerConfig's sections, one table each: api_keys, operator_keys, ...
    [manager.limits]      max_sessions_per_tenant, max_body_bytes, call_deadline_s, ...
    [manager.scheduling]  policy, tpot_target_ms, latency_cap_calls, early_fill, ...
    [manager.sharing]     prefix_sharing, min_prefix_tokens, ...
    [manager.engines]     heartbeat_interval_s, engine_dead_after_s, ...
    [manager.lifecycle]   shutdown_grace_s, expiry_interval_s

A setting's path is its table and key (`manager.scheduling.tpot_target_ms`); its flag is the key
with dashes (`--tpot-target-ms`; keys are unique across the manager's sections), booleans have a
`--no-` form, an optional number takes `none`. The two keys both the engine and the manager have
are `--policy` and `--aging-s` for the manager and `--engine-policy`, `--engine-aging-s` for the
engine. `parrot.cli.flags` builds the flags; `parrot.cli.reference` documents every setting.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import tomllib
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from parrot.cli.serve_config import ServeConfig
from parrot.engine.config import DTYPES, EngineConfig
from parrot.protocol.config_fields import SettingError, bound_of, default_of, doc_of
from parrot.serve.config import SECTIONS, ManagerConfig
from parrot.serve.policy.registry import POLICIES

ROOTS = ("serve", "engine", "manager")
# Table -> the dataclass whose fields are its keys, in the order the reference lists them.
TABLES: dict[str, type] = {
    "serve": ServeConfig,
    "engine": EngineConfig,
    **{f"manager.{name}": cls for name, cls in SECTIONS.items()},
}


def _attention_backends() -> tuple[str, ...]:
    # Imported when an attention backend is named: the registry imports torch, which the
    # client commands (status, run) need not wait for.
    from parrot.engine.attention.registry import backend_names

    return tuple(backend_names())


# Settings whose values come from a fixed set (each a function: some sets import the engine).
CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "engine.dtype": lambda: DTYPES,
    "engine.attention": _attention_backends,
    "engine.policy": lambda: ("fcfs", "priority"),
    "manager.scheduling.policy": lambda: tuple(sorted(POLICIES)),
}


class ConfigError(ValueError):
    """A setting's key or value is not allowed; the message names the key and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: where it lives (`table`, `key`), its type, default and one-line doc."""

    table: str
    key: str
    tp: Any
    default: Any
    doc: str
    bound: str = ""  # what a number must pass, as text ("> 0", ">= 1"); empty: no bound

    @property
    def path(self) -> str:
        return f"{self.table}.{self.key}"

    @property
    def root(self) -> str:
        return self.table.partition(".")[0]


@functools.cache
def all_settings() -> dict[str, Setting]:
    """Every setting by path, table by table in TABLES's order, each table in its fields' order."""
    out = {}
    for table, cls in TABLES.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            s = Setting(table, f.name, hints[f.name], default_of(f), doc_of(f), bound_of(f))
            out[s.path] = s
    return out


def settings_of(roots: Iterable[str]) -> list[Setting]:
    chosen = set(roots)
    return [s for s in all_settings().values() if s.root in chosen]


def describe(tp: Any) -> str:
    """A type as a person reads it: `int`, `float or none`, `list of str`, `'latency' | 'throughput'`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("none" if a is type(None) else describe(a) for a in args)
    if origin is tuple:
        return f"list of {describe(args[0])}"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def convert(key: str, tp: Any, value: Any) -> Any:
    """`value` (from a file or a flag's string) as type `tp`, or ConfigError naming `key`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        inner = next(a for a in args if a is not type(None))
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return convert(key, inner, value)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
        return tuple(convert(key, str, v) for v in items)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {describe(tp)}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{key}: expected a number ({tp.__name__}), got {value!r}")
        try:
            number = tp(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a number ({tp.__name__}), got {value!r}") from None
        if tp is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{key}: expected a whole number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported setting type {tp}")


def check(path: str, value: Any) -> Any:
    """One setting's value, typed and checked (ConfigError names the key and what is allowed)."""
    s = all_settings()[path]
    out = convert(path, s.tp, value)
    choices = CHOICES.get(path)
    allowed = choices() if choices is not None else None
    if allowed is not None and out not in allowed:
        raise ConfigError(f"{path}: {out!r} is not allowed; allowed values: {', '.join(allowed)}")
    return out


def _subtables(table: str) -> list[str]:
    return [t.rpartition(".")[2] for t in TABLES if t.startswith(table + ".")]


def _unknown_key(table: str, key: str) -> ConfigError:
    path = f"{table}.{key}"
    homes = [s.table for s in all_settings().values() if s.key == key]
    if len(homes) == 1:  # a key of another table: name that table
        return ConfigError(f"{path} is not a setting; it belongs in [{homes[0]}] ({homes[0]}.{key})")
    if table in TABLES:
        known = [f.name for f in dataclasses.fields(TABLES[table])]
        return ConfigError(f"{path} is not a setting; allowed keys in [{table}]: {', '.join(sorted(known))}")
    return ConfigError(f"{path} is not a table or a setting; the tables in [{table}]: {', '.join(_subtables(table))}")


def flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """A config file's nested tables as {path: value}, each checked."""
    out: dict[str, Any] = {}

    def walk(table: str, values: Any) -> None:
        if not isinstance(values, dict):
            raise ConfigError(f"{table}: expected a table of settings, got {values!r}")
        for key, value in values.items():
            path = f"{table}.{key}"
            if path in all_settings():
                out[path] = check(path, value)
            elif key in _subtables(table):
                walk(path, value)
            else:
                raise _unknown_key(table, key)

    for root, values in raw.items():
        if root not in ROOTS:
            raise ConfigError(f"{root} is not a config section; allowed: {', '.join(ROOTS)}")
        walk(root, values)
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    """A TOML (.toml) or JSON (.json) config file's settings by path, checked."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--config: cannot read {path}: {e.strerror}") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config: {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a table with keys {', '.join(ROOTS)}")
    return flatten(raw)


class Configs(NamedTuple):
    serve: ServeConfig
    engine: EngineConfig
    manager: ManagerConfig


def _kwargs(table: str, values: dict[str, Any]) -> dict[str, Any]:
    return {s.key: values[s.path] for s in all_settings().values() if s.table == table and s.path in values}


def _build(root: str, values: dict[str, Any]) -> Any:
    """The config of `root` from settings by path (absent ones take their defaults); its own checks'
    errors become ConfigError naming the key."""
    try:
        if root == "manager":
            return ManagerConfig(**{name: cls(**_kwargs(f"manager.{name}", values)) for name, cls in SECTIONS.items()})
        return TABLES[root](**_kwargs(root, values))
    except SettingError as e:
        message = str(e)
        raise ConfigError(
            f"{root}.{message}" if message.startswith(e.field) else f"{root}.{e.field}: {message}"
        ) from None


def build_configs(values: dict[str, Any]) -> Configs:
    """The three configs from settings by path."""
    return Configs(_build("serve", values), _build("engine", values), _build("manager", values))


def build_engine_config(values: dict[str, Any]) -> EngineConfig:
    return typing.cast(EngineConfig, _build("engine", values))


def defaults(roots: Iterable[str] = ROOTS) -> dict[str, Any]:
    return {s.path: s.default for s in settings_of(roots)}


def effective(configs: Configs) -> dict[str, Any]:
    """The built configs' settings by path: what runs (`engine.dtype` resolved from `auto`)."""
    out = {}
    for s in all_settings().values():
        obj: Any = getattr(configs, s.root)
        for part in s.table.split(".")[1:]:
            obj = getattr(obj, part)
        out[s.path] = getattr(obj, s.key)
    return out


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """Settings by path as a config file holds them (`parrot serve --print-config`): nested tables,
    plain JSON values."""

    def plain(v: Any) -> Any:
        return v.value if isinstance(v, enum.Enum) else list(v) if isinstance(v, tuple) else v

    out: dict[str, Any] = {}
    for path, value in values.items():
        *tables, key = path.split(".")
        node = out
        for t in tables:
            node = node.setdefault(t, {})
        node[key] = plain(value)
    return out
