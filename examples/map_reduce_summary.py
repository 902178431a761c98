"""Map-reduce summary: summarize every chunk in parallel, then combine the summaries.

The maps form one task group feeding one consumer; the manager starts the combine the moment the
last map finishes. With many chunks the combine is applied in rounds of `fan_in` summaries.

    python -m examples.map_reduce_summary --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

from examples.common import ASSISTANT, USER, chunk_words, cli
from parrot.frontend import SamplingParams, SemanticFunction, SemanticVariable, Session

MAP = SamplingParams(max_tokens=64, temperature=0.0)
REDUCE = SamplingParams(max_tokens=128, temperature=0.0)

summarize_chunk = SemanticFunction(
    "summarize_chunk",
    USER + "Summarize this part of a document in two sentences:\n{{input:chunk}}" + ASSISTANT + "{{output:summary}}",
    inputs=["chunk"],
    outputs={"summary": MAP},
)


def combiner(num_parts: int) -> SemanticFunction:
    """A semantic function with `num_parts` summary inputs (templates have fixed placeholders)."""
    parts = "\n".join(f"- {{{{input:part{i}}}}}" for i in range(num_parts))
    template = USER + "Combine these partial summaries into one summary:\n" + parts + ASSISTANT + "{{output:summary}}"
    return SemanticFunction(
        f"combine_{num_parts}", template, [f"part{i}" for i in range(num_parts)], {"summary": REDUCE}
    )


def map_reduce_summary(text: str, base_url: str, api_key: str = "parrot", chunk_len: int = 250, fan_in: int = 8) -> str:
    chunks = chunk_words(text, chunk_len)
    with Session(base_url, api_key=api_key):
        summaries: list[SemanticVariable] = [summarize_chunk(c) for c in chunks]
        while len(summaries) > 1:
            groups = [summaries[i : i + fan_in] for i in range(0, len(summaries), fan_in)]
            summaries = [combiner(len(g))(*g) if len(g) > 1 else g[0] for g in groups]
        return summaries[0].get()


if __name__ == "__main__":
    cli("Map-reduce summary of a document", map_reduce_summary)
