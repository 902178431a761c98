"""`parrot serve` settings: every field of `EngineConfig` and `ManagerConfig` as a flag and as a key
of a config file (TOML or JSON), checked with errors that name the key and the allowed values.

Precedence: the dataclasses' defaults, then the config file, then the command line. A config file
has three tables, each optional:

    [serve]    host, port, builtin, engine_urls, openai_engines, openai_model, openai_tokenizer,
               openai_api_key, openai_stream_interval
    [engine]   EngineConfig's fields (model, dtype, max_num_batched_tokens, latency_max_batched_tokens,
               latency_prefill_tokens, ...)
    [manager]  ManagerConfig's fields (api_keys, policy, tpot_target_ms, latency_cap_calls, ...)

Flags are the field names with dashes (`--latency-max-batched-tokens 128`); booleans have a
`--no-` form; an optional number takes `none`. The two fields both configs have are `--policy`
and `--aging-s` for the manager and `--engine-policy`, `--engine-aging-s` for the engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parrot.engine.config import EngineConfig
from parrot.protocol.errors import ParrotError
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.registry import POLICIES

SERVE_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 8000,
    "builtin": True,
    "engine_urls": [],
    "openai_engines": [],
    "openai_model": None,
    "openai_tokenizer": None,
    "openai_api_key": None,
    "openai_stream_interval": 1,
}
SERVE_TYPES: dict[str, Any] = {
    "host": str,
    "port": int,
    "builtin": bool,
    "engine_urls": tuple[str, ...],
    "openai_engines": tuple[str, ...],
    "openai_model": str | None,
    "openai_tokenizer": str | None,
    "openai_api_key": str | None,
    "openai_stream_interval": int,
}


def _attention_backends() -> tuple[str, ...]:
    # Imported when an attention backend is named: the registry imports torch, which the
    # client commands (status, run) need not wait for.
    from parrot.engine.attention.registry import backend_names

    return tuple(backend_names())


# Settings whose values come from a fixed set (each a function: some sets import the engine).
CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "engine.dtype": lambda: ("auto", "bfloat16", "float32"),
    "engine.attention": _attention_backends,
    "engine.policy": lambda: ("fcfs", "priority"),
    "manager.policy": lambda: tuple(sorted(POLICIES)),
}
LAZY_HELP = {"engine.attention": "a registered attention backend: paged, shared_prefix, ..."}
# Flags older than this module, kept: (flag, dest, argparse keywords).
ALIASES: list[tuple[str, str, dict[str, Any]]] = [
    ("--threads", "engine.num_threads", {"type": int, "metavar": "N"}),
    (
        "--api-key",
        "manager.api_keys",
        {"action": "append", "metavar": "KEY", "help": "accepted tenant API key (repeatable)"},
    ),
    (
        "--operator-key",
        "manager.operator_keys",
        {"action": "append", "metavar": "KEY", "help": "operator key (repeatable)"},
    ),
    ("--engine-url-allow", "manager.engine_url_allowlist", {"action": "append", "metavar": "PREFIX"}),
    (
        "--engine-url",
        "serve.engine_urls",
        {"action": "append", "metavar": "URL", "help": "also use an engine started elsewhere"},
    ),
    ("--openai-engine", "serve.openai_engines", {"action": "append", "metavar": "URL"}),
    ("--no-builtin", "serve.builtin", {"action": "store_false", "help": "no builtin engine"}),
]


class ConfigError(ValueError):
    """A setting's key or value is not allowed; the message names the key and what is allowed."""


def _fields(section: str) -> dict[str, Any]:
    """Key -> type of a section's settings."""
    if section == "serve":
        return SERVE_TYPES
    cls = EngineConfig if section == "engine" else ManagerConfig
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _defaults(section: str) -> dict[str, Any]:
    if section == "serve":
        return dict(SERVE_DEFAULTS)
    cls = EngineConfig if section == "engine" else ManagerConfig
    return {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}


SECTIONS = ("serve", "engine", "manager")


def _describe(tp: Any) -> str:
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
            raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {_describe(tp)}") from None
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


def check(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """Values of one section, typed and checked (ConfigError names the key and what is allowed)."""
    known = _fields(section)
    out = {}
    for name, value in values.items():
        key = f"{section}.{name}"
        if name not in known:
            raise ConfigError(f"{key} is not a setting; allowed keys in [{section}]: {', '.join(sorted(known))}")
        out[name] = convert(key, known[name], value)
        choices = CHOICES.get(key)
        allowed = choices() if choices is not None else None
        if allowed is not None and out[name] not in allowed:
            raise ConfigError(f"{key}: {out[name]!r} is not allowed; allowed values: {', '.join(allowed)}")
    return out


def read_config_file(path: Path) -> dict[str, dict[str, Any]]:
    """A TOML (.toml) or JSON (.json) config file's sections, checked."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--config: cannot read {path}: {e.strerror}") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config: {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a table with keys {', '.join(SECTIONS)}")
    out = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"{section} is not a config section; allowed: {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: expected a table of settings, got {values!r}")
        out[section] = check(section, values)
    return out


def _flag(section: str, name: str) -> str:
    clash = section == "engine" and name in _fields("manager")
    return "--" + ("engine-" if clash else "") + name.replace("_", "-")


def add_settings_args(p: argparse.ArgumentParser, sections: tuple[str, ...] = SECTIONS) -> None:
    """A flag per setting of `sections`, each stored only when given (dest `section.name`)."""
    own = {a[1] for a in ALIASES}
    for section in sections:
        group = p.add_argument_group(f"{section} settings (config file table [{section}])")
        defaults = _defaults(section)
        for flag, dest, kw in ALIASES:
            if dest.startswith(section + "."):
                group.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **kw)
        for name, tp in _fields(section).items():
            dest = f"{section}.{name}"
            if (dest in own and typing.get_origin(tp) is tuple) or dest == "serve.builtin":
                continue
            opts: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS}
            opts["help"] = f"default: {defaults[name]!r}"
            if dest in LAZY_HELP:
                opts["help"] += f"; {LAZY_HELP[dest]}"
            elif dest in CHOICES:
                opts["help"] += f"; one of {', '.join(CHOICES[dest]())}"
            if tp is bool or tp == bool | None:
                opts["action"] = argparse.BooleanOptionalAction
            else:
                opts["type"] = _parser_of(dest, tp)
                opts["metavar"] = _describe(tp).upper() if tp in (int, float, str) else "VALUE"
            group.add_argument(_flag(section, name), **opts)


def _parser_of(key: str, tp: Any) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return check(key.split(".")[0], {key.split(".")[1]: text})[key.split(".")[1]]
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def resolve(ns: argparse.Namespace, sections: tuple[str, ...] = SECTIONS) -> dict[str, dict[str, Any]]:
    """Defaults, then the file of `--config` (if any), then the flags given: each section's values."""
    merged = {s: _defaults(s) for s in sections}
    config = getattr(ns, "config", None)
    if config is not None:
        for section, values in read_config_file(Path(config)).items():
            if section in merged:
                merged[section].update(values)
    for dest, value in vars(ns).items():
        section, _, name = dest.partition(".")
        if section in merged and name:
            merged[section][name] = tuple(value) if isinstance(value, list) else value
    return merged


def build_configs(values: dict[str, dict[str, Any]]) -> tuple[EngineConfig, ManagerConfig]:
    """The two configs; their own checks' errors become ConfigError naming the key."""
    try:
        engine = EngineConfig(**values["engine"])
    except ValueError as e:
        raise ConfigError(f"engine: {e}") from None
    try:
        manager = ManagerConfig(**values["manager"])
    except (ValueError, ParrotError) as e:  # ParrotError names its field
        field = getattr(e, "field", None)
        raise ConfigError(f"manager.{field}: {e}" if field else f"manager: {e}") from None
    return engine, manager


def jsonable(values: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The settings as a config file would hold them (`parrot serve --print-config`)."""

    def plain(v: Any) -> Any:
        return v.value if isinstance(v, enum.Enum) else list(v) if isinstance(v, tuple) else v

    return {s: {k: plain(v) for k, v in vals.items()} for s, vals in values.items()}
