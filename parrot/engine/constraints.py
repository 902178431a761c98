"""Constrained output: a request's `regex`, `json_schema` or `choices` compiled to a grammar.

Owned by the engine (one `Grammars` per loaded tokenizer). The grammar engine is xgrammar: it
compiles a grammar once against the vocabulary (a JSON schema in milliseconds, cached by
xgrammar), then per step a matcher writes the allowed next tokens of its request into one row of a
packed bitmask (about 2-40 us), and one call masks the batch's logits (~0.2 ms for 32 rows of a
49k vocabulary). Compilation runs in the submitting thread, before the engine lock is taken, so a
slow schema never stalls the loop; a schema or regex it cannot compile is a 400 naming the field.

The logit adjustments that depend on a request's tokens so far (penalties, bias) and its
grammar's matcher live on its `SampleRow` (sampler.py), updated by the sampler as it chooses.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from parrot.protocol.errors import ParrotError
from parrot.protocol.sampling import SamplingParams


class Grammars:
    """Compiles constraints for one tokenizer; thread-safe (the compiler is built on first use:
    loading xgrammar and indexing the vocabulary takes ~0.5 s, paid only if a constraint comes)."""

    def __init__(self, tokenizer_folder: Path, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.tokenizer_folder = tokenizer_folder
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()

    def check(self, params: SamplingParams) -> Any:
        """Validate what needs the vocabulary; returns the compiled grammar (or None when
        unconstrained). Raises ParrotError (400) naming the field."""
        bad = next((t for t in params.logit_bias if t >= self.vocab_size), None)
        if bad is not None:
            raise ParrotError(
                f"logit_bias: token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                field="sampling.logit_bias",
            )
        if not params.constrained:
            return None
        compiler = self._get_compiler()
        try:
            if params.json_schema is not None:
                field = "sampling.json_schema"
                # Compact separators and no free whitespace: a model cannot loop on blanks.
                return compiler.compile_json_schema(
                    json.dumps(params.json_schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
                )
            if params.regex is not None:
                field = "sampling.regex"
                return compiler.compile_regex(params.regex)
            field = "sampling.choices"
            assert params.choices is not None
            return compiler.compile_grammar(choices_grammar(params.choices))
        except (RuntimeError, ValueError) as e:
            raise ParrotError(f"{field.split('.')[-1]} cannot be compiled: {_first_line(e)}", field=field) from None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr
                from transformers import PreTrainedTokenizerFast

                hf = PreTrainedTokenizerFast(tokenizer_file=str(self.tokenizer_folder / "tokenizer.json"))
                info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size, stop_token_ids=self.eos_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler


def new_matcher(grammar: Any) -> Any:
    """A fresh matcher (one per generation) over a compiled grammar."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(grammar)


def choices_grammar(choices: list[str]) -> str:
    """EBNF for exactly one of `choices`: string literals in JSON's escaping, which EBNF shares."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
