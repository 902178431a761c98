"""Map-reduce summary: summarize every chunk in parallel, then combine the summaries.

The maps form one task group feeding one consumer; the manager starts the combine the moment the
last map finishes, and the client fetches only the combined summary. The maps' prompts share
their beginning (the model's system prompt and the instruction before the chunk): filled once,
forked for each chunk. With many chunks the
combine is applied in rounds of `fan_in` summaries. `map_reduce_summary_request_level` is the
same app, one request at a time.

    python -m examples.map_reduce_summary --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from examples.common import chunk_words, cli
from examples.request_level import RequestLevel
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

T = TypeVar("T")


@semantic_function(chat=True, sampling=SamplingParams(max_tokens=48, temperature=0.0))
def summarize_chunk(chunk: Input, summary: Output):
    """user: Here is one part of a long speech:

    {{input:chunk}}

    Summarize it in two sentences.
    assistant: {{output:summary}}"""


@semantic_function(chat=True, sampling=SamplingParams(max_tokens=64, temperature=0.0))
def combine(summaries: Input, summary: Output):
    """user: Combine these summaries of a speech into one summary of two sentences:
    {{input:summaries}}
    assistant: {{output:summary}}"""


def reduce_in_rounds(summaries: list[T], merge: Callable[[list[T]], T], fan_in: int) -> T:
    while len(summaries) > 1:
        groups = [summaries[i : i + fan_in] for i in range(0, len(summaries), fan_in)]
        summaries = [merge(g) if len(g) > 1 else g[0] for g in groups]
    return summaries[0]


def map_reduce_summary(
    text: str, base_url: str, api_key: str | None = None, chunk_len: int = 110, fan_in: int = 8
) -> str:
    with Session(base_url, api_key=api_key):
        summaries = [summarize_chunk(c) for c in chunk_words(text, chunk_len)]
        return reduce_in_rounds(summaries, combine, fan_in).get()  # the only wait


def map_reduce_summary_request_level(text: str, client: RequestLevel, chunk_len: int = 110, fan_in: int = 8) -> str:
    summaries = [client(summarize_chunk, c) for c in chunk_words(text, chunk_len)]
    return reduce_in_rounds(summaries, lambda group: client(combine, group), fan_in)


if __name__ == "__main__":
    cli("Map-reduce summary of a document", map_reduce_summary)
