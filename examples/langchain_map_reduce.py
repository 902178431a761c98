"""LangChain map-reduce summary on Parrot: one LCEL chain of prompt templates, run two ways.

    awaited: ChatParrot(session)            each LangChain step waits for its replies, as with any
                                            LangChain model (a client round trip per level)
    lazy:    ChatParrot(session, lazy=True) replies are Semantic Variables passed along unawaited:
                                            the chain reaches the server as one DAG, and the
                                            manager starts the combine the moment the maps finish

    python -m examples.langchain_map_reduce --url http://127.0.0.1:8000 [--file document.txt]

Needs `langchain-core` (`pip install parrot-serve[langchain]`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnableSequence

from examples.common import SAMPLE_TEXT, chunk_words
from parrot.frontend import Session
from parrot.integrations.langchain import ChatParrot, resolver


def map_reduce_chain(llm: ChatParrot, session: Session) -> RunnableSequence[Any, Any]:
    summarize = (
        ChatPromptTemplate.from_template("Summarize this part of a document in two sentences:\n{chunk}")
        | llm
        | StrOutputParser()
    )
    combine = (
        ChatPromptTemplate.from_template("Combine these partial summaries into one summary:\n{summaries}")
        | llm
        | StrOutputParser()
    )
    return RunnableSequence(
        RunnableLambda(lambda chunks: [{"chunk": c} for c in chunks]),
        summarize.map(),
        RunnableLambda(lambda summaries: {"summaries": "\n".join(f"- {s}" for s in summaries)}),
        combine,
        resolver(session),  # the only wait of a lazy chain
    )


def langchain_map_reduce(
    text: str, base_url: str, api_key: str | None = None, chunk_len: int = 250, lazy: bool = True, max_tokens: int = 64
) -> str:
    with Session(base_url, api_key=api_key) as s:
        llm = ChatParrot(session=s, lazy=lazy, max_tokens=max_tokens, temperature=0.0)
        result: str = map_reduce_chain(llm, s).invoke(chunk_words(text, chunk_len))
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description="LangChain map-reduce on Parrot, awaited and lazy")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the Parrot manager's base URL")
    parser.add_argument("--api-key", default=None, help="none: a development manager")
    parser.add_argument("--file", type=Path, help="a text document (default: a short built-in text)")
    parser.add_argument("--chunk-len", type=int, default=250, help="words per map")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    text = args.file.read_text() if args.file else SAMPLE_TEXT
    for _ in range(args.repeats):
        for lazy in (False, True):
            start = time.perf_counter()
            result = langchain_map_reduce(text, args.url, args.api_key, args.chunk_len, lazy=lazy)
            mode = "lazy (one DAG)" if lazy else "awaited"
            print(f"[{mode}: {time.perf_counter() - start:.2f} s] {result[:100]!r}", flush=True)


if __name__ == "__main__":
    main()
