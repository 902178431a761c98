"""xgrammar against outlines-core on this model's vocabulary: compile time and per-token cost.

    pip install --no-deps --target /tmp/olt outlines-core==0.2.14   # not a project dependency
    OUTLINES_CORE_PATH=/tmp/olt python -m benchmarks.serving.grammar_engines

For two JSON schemas (a small one with a bounded string and integer, a nested one with an array
of objects), prints each engine's compile time (vocabulary setup apart) and the cost per token of
computing the allowed set and advancing by the token, walking a valid JSON text. xgrammar writes
a packed bitmask row (what the sampler applies); outlines-core's `Index.get_allowed_tokens`
returns a Python list of ids that a caller would still turn into a mask.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "recipe": {
        "type": "object",
        "properties": {
            "dish": {"type": "string"},
            "servings": {"type": "integer"},
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}, "action": {"type": "string"}},
                    "required": ["n", "action"],
                },
            },
        },
        "required": ["dish", "servings", "steps"],
    },
}
TEXTS = {"person": '{"name":"Al","age":3}', "recipe": '{"dish":"soup","servings":2,"steps":[{"n":1,"action":"boil"}]}'}


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def main() -> None:
    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    folder = resolve_model_folder(DEFAULT_MODEL)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    ids = {k: hf.encode(v, add_special_tokens=False) for k, v in TEXTS.items()}
    print(f"load average {os.getloadavg()[0]:.1f}")
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=49152, stop_token_ids=[2])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    for name, schema in SCHEMAS.items():
        t0 = time.perf_counter()
        grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        compile_s = time.perf_counter() - t0
        matcher, bitmask = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, 49152)
        t0 = time.perf_counter()
        for t in ids[name]:
            matcher.fill_next_token_bitmask(bitmask, 0)
            assert matcher.accept_token(t)
        per_token = (time.perf_counter() - t0) / len(ids[name])
        print(f"xgrammar      {name}: compile {compile_s * 1000:.0f} ms, mask + advance {per_token * 1e6:.0f} us/token")
    sys.path.insert(0, os.environ.get("OUTLINES_CORE_PATH", ""))
    from outlines_core import Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    decoder = byte_decoder()
    by_bytes: dict[bytes, list[int]] = {}
    for token, i in Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab().items():
        if i != 2 and all(c in decoder for c in token):
            by_bytes.setdefault(bytes(decoder[c] for c in token), []).append(i)
    vocab = Vocabulary(2, by_bytes)
    for name, schema in SCHEMAS.items():
        t0 = time.perf_counter()
        index = Index(build_regex_from_schema(json.dumps(schema)), vocab)
        compile_s = time.perf_counter() - t0
        state = index.get_initial_state()
        t0 = time.perf_counter()
        for t in ids[name]:
            index.get_allowed_tokens(state)
            state = index.get_next_state(state, t)
            assert state is not None
        per_token = (time.perf_counter() - t0) / len(ids[name])
        print(
            f"outlines-core {name}: compile {compile_s * 1000:.0f} ms, "
            f"allowed ids + advance {per_token * 1e6:.0f} us/token"
        )


if __name__ == "__main__":
    main()
