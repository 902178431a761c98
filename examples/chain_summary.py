"""Chain summary: a running summary of a document, refined with each next chunk.

Every link is submitted at once; each consumes the previous link's summary, so the manager runs
the chain link after link without a round trip to this client, which only waits for the last.
Every link's prompt begins as the map-reduce summary's maps do: that prefix is filled once (by
whichever call comes first, in any session) and forked for the others.
`chain_summary_request_level` is the same app, one request at a time.

    python -m examples.chain_summary --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

from examples.common import chunk_words, cli
from examples.request_level import RequestLevel
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

START = "(none: this is the first part)"


@semantic_function(chat=True, sampling=SamplingParams(max_tokens=48, temperature=0.0))
def refine(summary: Input, chunk: Input, refined: Output):
    """user: Here is one part of a long speech:

    {{input:chunk}}

    It follows this summary of the earlier parts: {{input:summary}}

    Summarize the speech so far in two sentences.
    assistant: {{output:refined}}"""


def chain_summary(text: str, base_url: str, api_key: str | None = None, chunk_len: int = 110) -> str:
    chunks = chunk_words(text, chunk_len)
    with Session(base_url, api_key=api_key):
        summary = refine(START, chunks[0])
        for chunk in chunks[1:]:
            summary = refine(summary, chunk)  # a variable: passed on, not awaited
        return summary.get()  # the only wait


def chain_summary_request_level(text: str, client: RequestLevel, chunk_len: int = 110) -> str:
    summary = START
    for chunk in chunk_words(text, chunk_len):
        summary = client(refine, summary, chunk)  # waits for each link
    return summary


if __name__ == "__main__":
    cli("Chain summary of a document", chain_summary)
