"""Chain summary: summarize the first chunk, then refine the running summary with each next chunk.

Every call is submitted at once; each refinement consumes the previous summary, so the manager
runs the chain link after link without a round trip to this client, which only waits for the last.

    python -m examples.chain_summary --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

from examples.common import chunk_words, cli
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

SUMMARY = SamplingParams(max_tokens=96, temperature=0.0)


@semantic_function(sampling=SUMMARY)
def summarize(chunk: Input, summary: Output):
    """<|im_start|>user
    Summarize this text in three sentences:
    {{input:chunk}}<|im_end|>
    <|im_start|>assistant
    {{output:summary}}"""


@semantic_function(sampling=SUMMARY)
def refine(summary: Input, chunk: Input, refined: Output):
    """<|im_start|>user
    Here is a summary of a document so far:
    {{input:summary}}
    Update it with this next part, in at most four sentences:
    {{input:chunk}}<|im_end|>
    <|im_start|>assistant
    {{output:refined}}"""


def chain_summary(text: str, base_url: str, api_key: str = "parrot", chunk_len: int = 250) -> str:
    chunks = chunk_words(text, chunk_len)
    with Session(base_url, api_key=api_key):
        summary = summarize(chunks[0])
        for chunk in chunks[1:]:
            summary = refine(summary, chunk)
        return summary.get()


if __name__ == "__main__":
    cli("Chain summary of a document", chain_summary)
