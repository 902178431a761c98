"""Native functions: ordinary Python between semantic calls, run in the client.

    @native_function
    def count_words(text: str) -> str:
        return str(len(text.split()))

    n = count_words(summary)       # a SemanticVariable at once; runs when `summary` is ready

The result (converted with str() if it is not text) enters the session as a variable that later
semantic calls can consume. An exception fails that variable, and so every call that depends on
it. The server never sees the code.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from parrot.frontend.core import SessionCore
from parrot.frontend.function import _check_same_session, current_session_core
from parrot.frontend.variable import SemanticVariable


class NativeFunction:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "native")
        self._signature = inspect.signature(fn)
        kinds = {p.kind for p in self._signature.parameters.values()}
        if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}:
            raise TypeError(f"native function {self.name}: use named parameters (no *args, **kwargs or /)")
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"NativeFunction({self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> SemanticVariable:
        return self.invoke(current_session_core(), *args, **kwargs)

    def invoke(self, core: SessionCore, *args: Any, **kwargs: Any) -> SemanticVariable:
        """Queue the call; variables among the arguments are awaited, their text passed in."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            if isinstance(value, SemanticVariable):
                _check_same_session(value, core, name)
        out = core.new_variable(self.name)
        core.run_native(self.fn, dict(bound.arguments), out)
        return out


def native_function(fn: Callable[..., Any]) -> NativeFunction:
    return NativeFunction(fn)
