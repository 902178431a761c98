"""A multi-output template: one call writes a joke, then its explanation, in one context.

The explanation is generated after the joke's tokens, so it can refer to them; both outputs are
variables the client reads (or streams) separately.

    python -m examples.multi_output --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function


@semantic_function(chat=True, sampling=SamplingParams(max_tokens=64, temperature=0.0))
def joke_with_explanation(
    topic: Input,
    joke: Output = Output(max_tokens=48, stop=["\n"]),  # noqa: B008
    explanation: Output = Output(max_tokens=64, stop=["\n"]),  # noqa: B008
):
    """user: Tell a one-line joke about {{input:topic}}, then explain it in one line.
    assistant: Joke:{{output:joke}}
    Explanation:{{output:explanation}}"""


def tell_joke(topic: str, base_url: str, api_key: str | None = None) -> tuple[str, str]:
    with Session(base_url, api_key=api_key):
        joke, explanation = joke_with_explanation(topic)
        print("Joke: ", end="", flush=True)
        for piece in joke.stream():  # tokens as they are generated
            print(piece, end="", flush=True)
        print()
        return joke.get(), explanation.get()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None, help="none: a development manager")
    parser.add_argument("--topic", default="parrots")
    args = parser.parse_args()
    _, explanation = tell_joke(args.topic, args.url, args.api_key)
    print("Explanation:", explanation)
