"""A stop string leaves the context holding exactly the output's text: the tokens it touches are
cut, the text before it in the first of them is re-tokenized, and a later fill continues there
with KV as correct as a fresh fill of the same tokens."""

from __future__ import annotations

from pathlib import Path

from test_engine_correctness import GREEDY, make_engine, prompt

from parrot.engine import sync_client
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams
from parrot.text import Tokenizer, cut_to_text


def token_texts(engine: LLMEngine, ids: list[int]) -> list[str]:
    """Each token's own text in the decoded output (whole characters only)."""
    decode = engine.tokenizer.decode
    return [decode(ids[: i + 1])[len(decode(ids[:i])) :] for i in range(len(ids))]


def generate_with_stop(engine: LLMEngine, context_id: str, stop: str) -> tuple[str, list[int], list[int]]:
    """(text, the last event's output_token_ids, the context's tokens) of a greedy run with `stop`."""
    sampling = SamplingParams(max_tokens=GREEDY.max_tokens, ignore_eos=True, stop=[stop])
    events = sync_client.extend(engine, ExtendRequest(context_id=context_id, parent_context_id="x", sampling=sampling))
    assert events[-1].finish_reason == "stop"
    assert all(e.output_token_ids is None for e in events[:-1])
    assert events[-1].output_token_ids is not None
    return "".join(e.text for e in events), events[-1].output_token_ids, list(engine.contexts.get(context_id).tokens)


def test_a_stop_string_is_cut_out_of_the_context(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder, block_size=4)
    try:
        start_free = engine.stats().num_blocks_free
        p = prompt(7, 9)
        sync_client.extend_only(engine, ExtendRequest(context_id="x", token_ids=p))
        free_run = sync_client.extend(engine, ExtendRequest(context_id="y", parent_context_id="x", sampling=GREEDY))
        ids = sync_client.token_ids(free_run)
        assert free_run[-1].output_token_ids == ids  # a length finish keeps every token
        text = "".join(e.text for e in free_run)
        pieces = token_texts(engine, ids)
        assert "".join(pieces) == text
        # A token of two or more characters, past the first, whose text first occurs where it stands.
        i = next(
            k
            for k in range(2, len(ids) - 1)
            if len(pieces[k]) >= 2 and text.index(pieces[k] + pieces[k + 1]) == len("".join(pieces[:k]))
        )
        before = "".join(pieces[:i])
        tok = engine.tokenizer

        # The stop begins mid-token: the token's first character is re-tokenized.
        got_text, output_ids, tokens = generate_with_stop(engine, "mid", pieces[i][1:] + pieces[i + 1])
        leftover = tok.encode(pieces[i][:1])
        assert got_text == before + pieces[i][:1]
        assert output_ids == ids[:i] + leftover
        assert tokens == p + ids[:i] + leftover
        assert tok.decode(tokens[len(p) :]) == got_text

        # The stop begins on a token boundary: the tokens before it, nothing re-tokenized.
        got_text, output_ids, tokens = generate_with_stop(engine, "edge", pieces[i] + pieces[i + 1])
        assert [got_text, output_ids, tokens] == [before, ids[:i], p + ids[:i]]

        # A fill after the cut continues as a fresh context of the same tokens does.
        more = prompt(8, 6)
        sync_client.extend_only(engine, ExtendRequest(context_id="mid", token_ids=more, append=True))
        mid_tokens = list(engine.contexts.get("mid").tokens)
        sync_client.extend_only(engine, ExtendRequest(context_id="fresh", token_ids=mid_tokens))
        cont = sync_client.extend(engine, ExtendRequest(context_id="mid", append=True, sampling=GREEDY))
        fresh = sync_client.extend(engine, ExtendRequest(context_id="fresh", append=True, sampling=GREEDY))
        assert sync_client.token_ids(cont) == sync_client.token_ids(fresh)
        for cid in ["x", "y", "mid", "edge", "fresh"]:
            engine.free(FreeContextRequest(context_id=cid))
        assert engine.stats().num_blocks_free == start_free
    finally:
        engine.stop()


def test_eos_is_not_appended_and_the_context_matches_the_report(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    try:
        p = prompt(7, 9)
        sync_client.extend_only(engine, ExtendRequest(context_id="x", token_ids=p))
        free_run = sync_client.extend(engine, ExtendRequest(context_id="y", parent_context_id="x", sampling=GREEDY))
        ids = sync_client.token_ids(free_run)
        # Make the fourth generated token the EOS: it ends the output and stays out of the context.
        engine.eos_ids = frozenset({ids[3]})
        sampling = SamplingParams(max_tokens=GREEDY.max_tokens)
        events = sync_client.extend(engine, ExtendRequest(context_id="z", parent_context_id="x", sampling=sampling))
        first = ids.index(ids[3])
        assert events[-1].finish_reason == "eos"
        assert events[-1].output_token_ids == ids[:first]
        assert engine.contexts.get("z").tokens == p + ids[:first]
    finally:
        engine.stop()


def test_cut_to_text_keeps_whole_characters(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    ids = tok.encode("ab語c")  # "ab", then "語" as three byte tokens, then "c"
    assert len(ids) == 5
    assert cut_to_text(tok, ids, "ab語c") == (5, [])
    assert cut_to_text(tok, ids, "ab語") == (4, [])
    # A stop string beginning inside "ab" or at "語": no token holds a partial character.
    assert cut_to_text(tok, ids, "ab") == (1, [])
    assert cut_to_text(tok, ids, "a") == (0, tok.encode("a"))
    assert cut_to_text(tok, ids, "") == (0, [])
