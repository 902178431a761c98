"""The request-level way to run the same semantic functions, for comparison: each call rendered by
this client (its input values put into its messages) and sent as one plain OpenAI chat completion
(`POST /v1/chat/completions`), waiting for the answer before the next call. The manager renders the
messages with the model's chat template, so each prompt is the one Parrot builds for the call.

What it gives up against a Parrot session: the manager sees one request at a time, so parallel
calls (a map stage, questions over one document) run one after another, every intermediate value
travels back to the client and out again, and nothing is known of the next call in advance.
Prefix caching across requests (at chat-message and token-block boundaries) still applies.

    client = RequestLevel(base_url)
    text = client(summarize, "a chunk")        # a str: the call's output, one request
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from parrot.frontend import Input, SemanticFunction
from parrot.frontend.inputs import parts_of
from parrot.protocol.chat import parse_chat
from parrot.protocol.template import Placeholder, PlaceholderKind, TextPiece


class RequestLevel:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 300.0) -> None:
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self.model = str(self.http.get("/v1/models").raise_for_status().json()["data"][0]["id"])
        self._lock = threading.Lock()
        self.num_requests = 0  # answered so far (a display may read it from another thread)

    def __enter__(self) -> RequestLevel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def __call__(self, fn: SemanticFunction, *args: str | list[str]) -> str:
        """The output of `fn` on these inputs (text, or a list of texts: numbered lines, as the SDK
        renders a list by default): one chat completion, awaited."""
        if fn.messages is None:
            raise ValueError(f"{fn.name}: the request-level client runs chat-form functions")
        if len(args) != len(fn.inputs) or len(fn.outputs) != 1:
            raise ValueError(f"{fn.name}: give every input ({fn.inputs}); one output only")
        values = {name: "".join(map(str, parts_of(v, Input(), name))) for name, v in zip(fn.inputs, args, strict=True)}
        chat = parse_chat([(m.role, m.content) for m in fn.messages])
        *prompt, (role, reply) = chat.messages
        if role != "assistant" or reply != (Placeholder(fn.outputs[0], PlaceholderKind.OUTPUT),):
            raise ValueError(f"{fn.name}: the last message must be the assistant's output alone")
        messages = [{"role": r, "content": "".join(_text(p, values) for p in pieces)} for r, pieces in prompt]
        sampling = fn.sampling[fn.outputs[0]]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
        }
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        reply_json = self.http.post("/v1/chat/completions", json=body).raise_for_status().json()
        with self._lock:
            self.num_requests += 1
        return str(reply_json["choices"][0]["message"]["content"])


def _text(piece: TextPiece | Placeholder, values: dict[str, str]) -> str:
    return piece.text if isinstance(piece, TextPiece) else values[piece.name]
