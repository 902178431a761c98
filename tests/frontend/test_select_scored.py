"""A scored select end to end on the builtin engine (tiny random model): every option is scored as
a fork of the filled prompt, the most likely one is the value, the scores come with it, and nothing
is generated (one fill of the prompt plus a short scoring fill per option)."""

from __future__ import annotations

import pytest
from live_server import LiveServer

from parrot.frontend import Input, Output, Session, select, semantic_function

OPTIONS = ["yes", "no", "maybe so"]


@semantic_function
def judge(claim: Input, verdict: Output = select(OPTIONS)):  # noqa: B008
    """Claim: {{input:claim}}
    Is it true?{{output:verdict}}"""


@semantic_function
def judge_by_grammar(claim: Input, verdict: Output = select(OPTIONS, scored=False)):  # noqa: B008
    """Claim: {{input:claim}}
    Is it true?{{output:verdict}}"""


def test_a_scored_select_picks_the_most_likely_option_without_generating(server: LiveServer) -> None:
    before = server.stats()
    with Session(server.url):
        verdict = judge("The sky is green.")
        value = verdict.get()
    after = server.stats()
    scores = verdict.scores
    assert scores is not None and sorted(scores) == sorted(OPTIONS)
    assert all(s < 0 for s in scores.values())
    assert value == max(OPTIONS, key=lambda o: scores[o])
    assert after.num_decode_tokens == before.num_decode_tokens  # scored, not generated


def test_scores_are_each_options_logprob_given_the_prompt(server: LiveServer) -> None:
    # The same claim twice: the same scores (a fork of the same prompt each time, float32), to
    # float32 rounding: this server's engine is not in batch-invariant mode, and the two calls'
    # forks may be scored in one step or in two (1e-7 relative apart in one run of the suite).
    with Session(server.url):
        first, second = judge("Water is wet."), judge("Water is wet.")
        first.get(), second.get()
    assert first.scores is not None and second.scores is not None
    assert first.scores == pytest.approx(second.scores, rel=1e-5)


def test_an_unscored_select_is_generated_under_the_grammar(server: LiveServer) -> None:
    before = server.stats()
    with Session(server.url):
        verdict = judge_by_grammar("The sky is green.")
        assert verdict.get() in OPTIONS
    assert [verdict.scores is None, server.stats().num_decode_tokens > before.num_decode_tokens] == [True, True]
