"""Questions over one document: every question is a call whose prompt starts with the same
document, so the manager fills the document once and forks it for each question (a Semantic
Variable boundary ends the document: a plain chat request, whose question shares its message,
could share it only up to the last whole token block).

All questions are submitted at once; the manager batches their answers on the engine. The
request-level twin (`doc_questions_request_level`) asks them one request at a time.

    python -m examples.doc_questions --url http://127.0.0.1:8000 --file document.txt
"""

from __future__ import annotations

from examples.common import cli
from examples.request_level import RequestLevel
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

QUESTIONS = [
    "What does the speaker ask Congress to do?",
    "What does the speaker say about spending?",
    "What is the main goal of this speech?",
    "What does the speaker warn against?",
]


@semantic_function(chat=True, sampling=SamplingParams(max_tokens=40, temperature=0.0, stop=["\n"]))
def answer(document: Input, question: Input, answer: Output):
    """user: Read this speech.

    {{input:document}}

    {{input:question}}
    assistant: {{output:answer}}"""


def formatted(answers: list[str]) -> str:
    return "\n".join(f"Q: {q}\nA: {a.strip()}" for q, a in zip(QUESTIONS, answers, strict=True))


def doc_questions(text: str, base_url: str, api_key: str | None = None) -> str:
    with Session(base_url, api_key=api_key) as s:
        document = s.variable("document", text)
        answers = [answer(document, q) for q in QUESTIONS]  # submitted together, not awaited
        return formatted([a.get() for a in answers])


def doc_questions_request_level(text: str, client: RequestLevel) -> str:
    return formatted([client(answer, text, q) for q in QUESTIONS])


if __name__ == "__main__":
    cli("Questions over one document", doc_questions)
