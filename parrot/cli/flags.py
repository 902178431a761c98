"""The flags of `parrot serve` and `parrot engine`: one per setting (`parrot.cli.settings`), named by
its key (`--tpot-target-ms`), plus the aliases users know; and the merge of defaults, config file and
flags into settings by path."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parrot.cli.settings import (
    CHOICES,
    ROOTS,
    ConfigError,
    Setting,
    all_settings,
    check,
    defaults,
    describe,
    read_config_file,
    settings_of,
)

# Flags kept beside the derived ones: (flag, setting path, argparse keywords).
ALIASES: list[tuple[str, str, dict[str, Any]]] = [
    ("--threads", "engine.num_threads", {"type": int, "metavar": "N"}),
    (
        "--api-key",
        "manager.auth.api_keys",
        {"action": "append", "metavar": "KEY", "help": "accepted tenant API key (repeatable)"},
    ),
    (
        "--operator-key",
        "manager.auth.operator_keys",
        {"action": "append", "metavar": "KEY", "help": "operator key (repeatable)"},
    ),
    ("--engine-url-allow", "manager.auth.engine_url_allowlist", {"action": "append", "metavar": "PREFIX"}),
    (
        "--engine-url",
        "serve.engine_urls",
        {"action": "append", "metavar": "URL", "help": "also use an engine started elsewhere"},
    ),
    ("--openai-engine", "serve.openai_engines", {"action": "append", "metavar": "URL"}),
    ("--no-builtin", "serve.builtin", {"action": "store_false", "help": "no builtin engine"}),
]
LAZY_HELP = {"engine.attention": "a registered attention backend: paged, shared_prefix, ..."}


def flag_of(s: Setting) -> str | None:
    """The setting's flag, or None where an alias stands for it (a list, or `serve.builtin`)."""
    if s.path == "serve.builtin" or (s.path in {a[1] for a in ALIASES} and typing.get_origin(s.tp) is tuple):
        return None
    manager_keys = {m.key for m in settings_of(["manager"])}
    clash = s.root == "engine" and s.key in manager_keys
    return "--" + ("engine-" if clash else "") + s.key.replace("_", "-")


def aliases_of(s: Setting) -> list[str]:
    return [flag for flag, path, _ in ALIASES if path == s.path]


def add_settings_args(p: argparse.ArgumentParser, roots: tuple[str, ...] = ROOTS) -> None:
    """A flag per setting under `roots`, each stored only when given (dest: the setting's path)."""
    groups: dict[str, Any] = {}  # table -> its argument group
    for s in settings_of(roots):
        if s.table not in groups:
            groups[s.table] = p.add_argument_group(f"{s.table} settings (config file table [{s.table}])")
            for flag, path, kw in ALIASES:
                if path.rpartition(".")[0] == s.table:
                    groups[s.table].add_argument(flag, dest=path, default=argparse.SUPPRESS, **kw)
        derived = flag_of(s)
        if derived is None:
            continue
        opts: dict[str, Any] = {"dest": s.path, "default": argparse.SUPPRESS}
        opts["help"] = f"{s.doc} (default: {s.default!r})".replace("%", "%%")
        if s.path in LAZY_HELP:
            opts["help"] += f"; {LAZY_HELP[s.path]}"
        elif s.path in CHOICES:
            opts["help"] += f"; one of {', '.join(CHOICES[s.path]())}"
        if s.tp is bool or s.tp == bool | None:
            opts["action"] = argparse.BooleanOptionalAction
        else:
            opts["type"] = _parser_of(s.path)
            opts["metavar"] = describe(s.tp).upper() if s.tp in (int, float, str) else "VALUE"
        groups[s.table].add_argument(derived, **opts)


def _parser_of(path: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return check(path, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def resolve(ns: argparse.Namespace, roots: tuple[str, ...] = ROOTS) -> dict[str, Any]:
    """Defaults, then the file of `--config` (if any), then the flags given: settings by path."""
    merged = defaults(roots)
    config = getattr(ns, "config", None)
    if config is not None:
        merged.update({p: v for p, v in read_config_file(Path(config)).items() if p in merged})
    for dest, value in vars(ns).items():
        if dest in merged and dest in all_settings():
            merged[dest] = tuple(value) if isinstance(value, list) else value
    return merged
