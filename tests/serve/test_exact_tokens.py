"""Boundary-exact tokenization: the ids the manager fills are the tokenizer's ids for the rendered
prompt (runtime/render.py), against the in-memory FakeEngine and the default model's tokenizer.

Covers a corpus of template/value pairs (placeholders at the start, middle, end, adjacent; values
with spaces, newlines, punctuation, non-ASCII, special-token text, empty), the stable prefix an
early fill stops at, a refill when early tokens turn out wrong, multi-output templates, and prefix
sharing at a variable boundary.
"""

from __future__ import annotations

import asyncio
import bisect
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from manager_harness import new_session, run_manager

from parrot.protocol.engine_api import ExtendRequest, TokenEvent
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import ManagerConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.text import Tokenizer

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizer_corpus.md"
ODD_VALUES = [
    "",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "\nnewline first",
    "ends with a newline\n",
    "\n\n",
    " ",
    "tabs\tand\ttabs",
    "punctuation!?.,;:",
    "naïve café — 東京 🚀",
    "'re a contraction",
    "'",
    "<|im_",
    "x<|im_end|>y",
    "12345",
    "Plan",
    "lan a trip",
]


class PromptRecorder(FakeEngine):
    """A FakeEngine that keeps the prompt of every generating Extend (its own tokens included), by call id."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.prompts: dict[str, list[list[int]]] = {}

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        if req.sampling is not None:
            call_id = req.context_id.split(".")[1]
            held = self.contexts.get(req.parent_context_id or req.context_id, [])  # then its own tokens, if any
            self.prompts.setdefault(call_id, []).append([*held, *req.token_ids])
        async for event in super().extend(req):
            yield event


def corpus_text() -> str:
    """Prose, Markdown, code, numbers, non-ASCII text and long words (tests/fixtures)."""
    text = CORPUS.read_text(encoding="utf-8")
    return text.replace("{{", "{ {")  # literal text, never a placeholder


def fragments(rng: random.Random, text: str, n: int) -> list[str]:
    """Slices of the corpus cut at any character (mid-word too), plus odd values."""
    out = list(ODD_VALUES)
    while len(out) < n:
        start = rng.randrange(len(text) - 200)
        out.append(text[start : start + rng.choice([1, 3, 12, 40, 150])])
    return out


# (template parts): "A"/"B" are constant text, "x"/"y" input placeholders, the output always last.
PATTERNS = [
    ("x", "A"),  # a placeholder at the start
    ("A", "x", "B"),  # in the middle
    ("A", "x"),  # at the end, right before the output
    ("A", "x", "y", "B"),  # adjacent placeholders
    ("x", "y"),  # nothing but placeholders
    ("A", "x", "B", "y"),
]


def build_corpus(n: int) -> list[tuple[str, dict[str, str], list[str]]]:
    """(template, values, the rendered prompt's pieces) triples."""
    rng = random.Random(13)
    frags = fragments(rng, corpus_text(), 200)
    out = []
    for i in range(n):
        parts = PATTERNS[i % len(PATTERNS)]
        template, rendered, values = "", [], {}
        for part in parts:
            if part in ("x", "y"):
                value = frags[(i * 7 + len(values) * 13) % len(frags)] if part == "x" else rng.choice(frags)
                values[part] = value
                template += f"{{{{input:{part}}}}}"
                rendered.append(value)
            else:
                text = rng.choice(frags) or "Text"
                text += rng.choice(["", " ", ": ", "\n", "\n\n", "  "])
                template += text
                rendered.append(text)
        out.append((template + "{{output:o}}", values, rendered))
    return out


def test_a_known_prefix_keeps_only_tokens_no_continuation_can_change(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    rng = random.Random(7)
    text = corpus_text()
    pieces = fragments(rng, text, 400)
    num_kept = num_tokens = 0
    for i in range(3000):
        known = pieces[i % len(pieces)] + rng.choice(["", " ", "\n", ". ", "'", "<|im"])
        rest = rng.choice(pieces)
        ids, ends = tok.encode_offsets(known)
        n = bisect.bisect_right(ends, tok.stable_len(known))
        assert tok.encode(known + rest)[:n] == ids[:n], (known, rest)
        num_kept, num_tokens = num_kept + n, num_tokens + len(ids)
    # Conservative, not useless: only the tail's last pre-tokens are held back.
    assert num_kept > 0.75 * num_tokens
    assert tok.stable_len("Problem: ") == len("Problem:")  # the space belongs to the next word
    assert tok.stable_len("Say it's x'r") == len("Say it's x")  # "'r" + "e" is the contraction "'re"
    # may become <|im_end|>, before which the space is a token of its own; else it joins " <|"
    assert tok.stable_len("hello <|im_") == len("hello")


@pytest.mark.parametrize("before", ["  ", "\n\n", "x  \n ", " ", "word"])
def test_a_prefix_ending_inside_an_added_token_keeps_the_text_before_it_unsettled(
    default_model_folder: Path, before: str
) -> None:
    """Cut inside "<|im_start|>": the text before an added token is pre-tokenized as a text that ends
    there (a run of spaces stays one pre-token), so the cached prefix must stop before that run."""
    tok = Tokenizer(default_model_folder)
    text = "the quick brown fox " * 40 + "2.2" + before + "<|im_start|>\nsession the latency"
    for cut in (text.index("|>\nsession"), text.index("im_start"), text.index("start|>")):
        assert tok.encode_offsets(text, known_prefix=cut) == tok._encode_whole(text)


def test_a_cached_known_prefix_tokenizes_exactly_as_the_whole_text(default_model_folder: Path) -> None:
    """encode_offsets(text, known_prefix) reuses the prefix's stable tokens and tokenizes the rest:
    ids and ends must equal the whole text's, wherever the prefix ends (mid-word, in a run of
    spaces, on an apostrophe, inside a special token, after a multi-byte character)."""
    tok = Tokenizer(default_model_folder)
    rng = random.Random(11)
    hard = ["  ", "\n\n", "'re", "’ll", "<|im_start|>", "<|im_", "é", "中文", "🦜"]
    pieces = [*fragments(rng, corpus_text(), 400), *hard]
    num_cached = 0
    for _ in range(400):
        text = "".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "  "]) for _ in range(rng.randint(60, 160)))
        cut = rng.randint(512, len(text)) if len(text) > 512 else 512
        whole = tok._encode_whole(text)
        assert tok.encode_offsets(text, known_prefix=cut) == whole, (text[:cut], text[cut:])
        num_cached += cut <= len(text)
    # The same prefix again, another continuation: served from the cache, still exact.
    system = "".join(rng.choice(pieces) + " " for _ in range(300))
    for query in ("Plan a trip", " to Rome", "'re you there?", "\n\nUser: hi"):
        assert tok.encode_offsets(system + query, known_prefix=len(system)) == tok._encode_whole(system + query)
    assert tok._prefix_tokens.cache_info().hits >= 3 and num_cached > 300


def test_a_corpus_of_calls_fills_exactly_the_rendered_prompts_ids(default_model_folder: Path) -> None:
    """220 calls, half of whose values arrive after submit (early fills, forks from cached prefixes)."""
    corpus = build_corpus(220)
    engine = PromptRecorder(default_model_folder, max_model_len=8192)
    tok = engine.tokenizer

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        late: dict[str, str] = {}
        variables, calls = [], []
        for i, (template, values, _) in enumerate(corpus):
            bindings = {}
            for name, value in values.items():
                var_id = f"v{i}{name}"
                if i % 2:
                    late[var_id] = value
                    variables.append(VariableSpec(var_id=var_id))
                else:
                    variables.append(VariableSpec(var_id=var_id, value=value))
                bindings[name] = Binding(var_id=var_id)
            calls.append(CallSpec(template=template, bindings=bindings, default_sampling=SamplingParams(max_tokens=2)))
        manager.submit(session, SubmitRequest(variables=variables, calls=calls))
        await asyncio.sleep(0.05)  # the early fills of the waiting calls
        for var_id, value in late.items():
            manager.set_variable(session, var_id, value)
        for i in range(len(corpus)):
            await manager.get_variable(session, f"c{i}~o")
        assert manager.status(session).num_calls_done == len(corpus)

    run_manager([engine], body, ManagerConfig())
    num_merged = 0
    for i, (_, _, pieces) in enumerate(corpus):
        assert engine.prompts[f"c{i}"] == [tok.encode("".join(pieces))], (i, pieces)
        num_merged += tok.encode("".join(pieces)) != [t for piece in pieces for t in tok.encode(piece)]
    # The corpus does exercise merges across boundaries: piece-by-piece ids would differ for many.
    assert num_merged > 100


def ops_of(engine: FakeEngine, call_id: str) -> list[tuple[str, int]]:
    return [(op, n) for _, op, c, n in engine.log if c.endswith(f".{call_id}") and op != "generated"]


@pytest.mark.parametrize("sharing", [True, False])
@pytest.mark.parametrize("conservative", [True, False])
def test_early_fill_then_run_gives_the_engine_the_rendered_ids(
    default_model_folder: Path, monkeypatch: pytest.MonkeyPatch, sharing: bool, conservative: bool
) -> None:
    """The ready prefix "Problem: " is filled early, the value "Plan a trip" arrives, the call runs.
    Not `conservative`: a stable rule that keeps the trailing space (`Ġ`) is patched in, so the early
    tokens are wrong ("Problem: Plan" is `ĠPlan`): the run must start its context over."""
    if not conservative:
        monkeypatch.setattr(Tokenizer, "stable_len", lambda self, text, end=None: len(text) if end is None else end)
    engine = PromptRecorder(default_model_folder)
    tok = engine.tokenizer
    usage: list[int] = []
    system = "You are a planner who thinks in short numbered steps. " * 3
    rendered = system + "Problem: Plan a trip\nAnswer:"
    # A long constant prefix so that, with sharing, it is cached and the early fill only warms it.
    template = system + "Problem: {{input:p}}\nAnswer:{{output:a}}"

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        spec = CallSpec(template=template, bindings={"p": Binding(var_id="p")})
        manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="p")], calls=[spec]))
        while not any(op == "fill" for _, op, _, _ in engine.log):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        manager.set_variable(session, "p", "Plan a trip")
        await manager.get_variable(session, "c0~a")
        usage.append(session.runs["c0"].num_prompt_tokens)

    run_manager([engine], body, ManagerConfig(sharing=SharingConfig(prefix_sharing=sharing, min_prefix_tokens=8)))
    assert engine.prompts["c0"] == [tok.encode(rendered)]
    n_full = len(tok.encode(rendered))
    assert usage == [n_full]  # a refill is not counted twice
    n_stable = len(tok.encode(system + "Problem:"))  # `ĠPlan` takes the space: the boundary is before it
    n_early = n_stable if conservative else n_stable + 1  # the patched rule also fills `Ġ`
    pfx = [n for _, op, c, n in engine.log if op == "fill" and c.startswith("pfx-")]
    gen = ("generate", n_full)  # the run's fill travels in its generating Extend ("generate-fill")
    if sharing and conservative:  # the early fill warmed the ready prefix; the call forked from it
        assert [pfx, ops_of(engine, "c0")] == [[n_stable], [("generate-fill", n_full - n_stable), gen, ("free", 0)]]
    elif sharing:  # the wrong early prefix hashes differently: never forked from, a right one is filled
        assert [pfx, ops_of(engine, "c0")] == [
            [n_early, n_stable],
            [("generate-fill", n_full - n_stable), gen, ("free", 0)],
        ]
    elif conservative:  # the early fill filled the call's own context; the run only the rest
        assert [pfx, ops_of(engine, "c0")] == [
            [],
            [("fill", n_early), ("generate-fill", n_full - n_early), gen, ("free", 0)],
        ]
    else:  # the wrong `Ġ` was in the call's own context: freed and filled again, whole
        assert [pfx, ops_of(engine, "c0")] == [
            [],
            [("fill", n_early), ("free", 0), ("generate-fill", n_full), gen, ("free", 0)],
        ]


def test_text_after_an_output_is_tokenized_on_its_own(default_model_folder: Path) -> None:
    """The output's tokens are the sampled ones; the text that follows it is not merged with them
    (the rendered text " red" + "dish ones" would be `Ġreddish`, `Ġones`)."""
    engine = PromptRecorder(default_model_folder, responder=lambda p: " red" if p.endswith(": ") else " OK")
    tok = engine.tokenizer

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        spec = CallSpec(template="Name a color: {{output:a}}dish ones, now animals:{{output:b}}")
        manager.submit(session, SubmitRequest(calls=[spec]))
        assert (await manager.get_variable(session, "c0~b")).value == " OK"

    run_manager([engine], body, ManagerConfig())
    first = tok.encode("Name a color: ")  # exact up to the output, trailing `Ġ` included
    second = first + tok.encode(" red") + tok.encode("dish ones, now animals:")
    assert engine.prompts["c0"] == [first, second]
    assert second != tok.encode("Name a color:  reddish ones, now animals:")


def test_calls_with_one_template_share_the_prefix_up_to_the_variable_boundary(default_model_folder: Path) -> None:
    """The constant text ends with "\\n\\n": its tokens merge with no value's first word, so both calls
    share them (the nearest token boundary); the stable boundary (before "\\n\\n") is the template's
    leading prefix, cached first."""
    engine = PromptRecorder(default_model_folder)
    tok = engine.tokenizer
    system = "Read the question below and answer it in one careful sentence. " * 3 + "\n\n"
    questions = ["What is a parrot?", "How do parrots talk?"]

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        calls = [
            CallSpec(template=system + "{{input:q}}\nAnswer:{{output:a}}", bindings={"q": Binding(value=q)})
            for q in questions
        ]
        manager.submit(session, SubmitRequest(calls=calls))
        for i in (0, 1):
            await manager.get_variable(session, f"c{i}~a")

    run_manager([engine], body, ManagerConfig())
    prompts = [tok.encode(system + q + "\nAnswer:") for q in questions]
    n_stable = len(tok.encode(system.rstrip()))
    n_nearest = n_stable + 2  # `Ċ`, `Ċ`
    assert prompts[0][:n_nearest] == prompts[1][:n_nearest] and prompts[0][n_nearest] != prompts[1][n_nearest]
    assert [engine.prompts[f"c{i}"] for i in (0, 1)] == [[p] for p in prompts]
    pfx = [n for _, op, c, n in engine.log if op == "fill" and c.startswith("pfx-")]
    assert pfx == [n_stable, n_nearest - n_stable]
    assert [ops for ops in (ops_of(engine, "c0")[0], ops_of(engine, "c1")[0])] == [
        ("generate-fill", len(p) - n_nearest) for p in prompts
    ]
