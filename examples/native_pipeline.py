"""A native function in a pipeline: LLM -> Python -> LLM, declared at once.

`summarize` (an LLM call) condenses the text; `key_terms` (ordinary Python, run in this client
when the summary is ready) picks its most frequent content words; `write_title` (an LLM call)
consumes them. The server never runs the Python; its result enters the session as a variable.

    python -m examples.native_pipeline --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

import collections
import re

from examples.common import cli
from parrot.frontend import SamplingParams, SemanticFunction, Session, assistant, native_function, user

summarize = SemanticFunction(
    "summarize",
    [user("Summarize this text in three sentences:\n{{input:text}}"), assistant("{{output:summary}}")],
    inputs=["text"],
    outputs={"summary": SamplingParams(max_tokens=96, temperature=0.0)},
)

write_title = SemanticFunction(
    "write_title",
    [user("Write a short title for an article about {{input:terms}}."), assistant("Title:{{output:title}}")],
    inputs=["terms"],
    outputs={"title": SamplingParams(max_tokens=24, temperature=0.0, stop=["\n"])},
)

_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "in",
        "is",
        "it",
        "its",
        "more",
        "most",
        "not",
        "of",
        "on",
        "or",
        "our",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "which",
        "will",
        "with",
        "you",
        "your",
        "also",
        "can",
        "all",
        "new",
        "one",
        "us",
    ]
)


@native_function
def key_terms(summary: str, top: int = 3) -> str:
    """The `top` most frequent content words of the summary (plain Python, client side)."""
    words = [w for w in re.findall(r"[a-z][a-z'-]+", summary.lower()) if w not in _STOPWORDS and len(w) > 2]
    return ", ".join(w for w, _ in collections.Counter(words).most_common(top)) or "this text"


def titled(text: str, base_url: str, api_key: str | None = None) -> str:
    with Session(base_url, api_key=api_key) as session:
        document = session.variable("document", text)
        summary = summarize(document)
        terms = key_terms(summary)
        title = write_title(terms)
        return f"{title.get().strip()}  (key terms: {terms.get()})"


if __name__ == "__main__":
    cli("Summary -> native key terms -> title", titled)
