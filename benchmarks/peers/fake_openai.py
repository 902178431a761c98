"""A fake OpenAI-compatible completion server (vLLM's dialect), for tests of the engine adapter
and for `benchmarks.serving.manager_path` (`python -m benchmarks.peers.fake_openai --port N`).

It records every `/v1/completions` body, and answers each with `max_tokens` copies of one token
(streamed one per chunk as vLLM streams them with `logprobs: 0` + `return_tokens_as_token_ids`,
or as `token_ids` with `return_token_ids`, or `stream_interval` per chunk, or whole), a token's
delay growing with the number of requests it serves at once (a batching engine's step), and usage
with the prompt's length. Like vLLM without `--scheduling-policy priority`, it can refuse a
non-zero `priority` with vLLM's 400.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from parrot.text import Tokenizer


class FakeOpenAI:
    def __init__(
        self,
        folder: Path,
        *,
        model: str = "fake",
        priority_scheduling: bool = True,
        step_ms: float = 0.0,
        step_ms_per_request: float = 0.0,
    ) -> None:
        self.tokenizer = Tokenizer(folder)
        self.folder = folder
        self.model = model
        self.priority_scheduling = priority_scheduling
        self.step_ms = step_ms  # a token's delay: step_ms + step_ms_per_request x requests served
        self.step_ms_per_request = step_ms_per_request
        self.token_id = self.tokenizer.encode(" ok")[0]
        self.bodies: list[dict[str, Any]] = []
        self.num_running = 0
        self.num_model_reads = 0  # GET /v1/models: the adapter's model card, then its heartbeats

    def prompt_tokens(self, body: dict[str, Any]) -> list[int]:
        """The prompt a request sent, as tokens (a text prompt tokenized as the server would)."""
        prompt = body["prompt"]
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            self.num_model_reads += 1
            return {"data": [{"id": self.model, "max_model_len": 4096, "root": str(self.folder)}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            if body.get("priority", 0) and not self.priority_scheduling:
                message = f"Got priority {body['priority']} but Priority scheduling is not enabled."
                return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)
            if body.get("stream"):
                return StreamingResponse(self._stream(body), media_type="text/event-stream")
            text = await self._generate(body, lambda _: None)
            usage = self._usage(body)
            return JSONResponse({"choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage})

        return app

    def _usage(self, body: dict[str, Any]) -> dict[str, int]:
        num_prompt = len(self.prompt_tokens(body))
        return {"prompt_tokens": num_prompt, "completion_tokens": body["max_tokens"]}

    async def _generate(self, body: dict[str, Any], emit: Any) -> str:
        self.num_running += 1
        try:
            for i in range(body["max_tokens"]):
                await asyncio.sleep((self.step_ms + self.step_ms_per_request * self.num_running) / 1000.0)
                emit(i)
        finally:
            self.num_running -= 1
        return self.tokenizer.decode([self.token_id] * body["max_tokens"])

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[str]:
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        task = asyncio.create_task(self._generate(body, queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        text = self.tokenizer.decode([self.token_id])
        interval, num_held = body.get("stream_interval", 1), 0  # vLLM's: tokens per chunk
        try:
            while (i := await queue.get()) is not None:
                finish = "length" if i == body["max_tokens"] - 1 else None
                num_held += 1
                if num_held < interval and finish is None:
                    continue
                choice = {"index": 0, "text": text * num_held, "logprobs": None, "finish_reason": finish}
                if body.get("return_token_ids"):  # vLLM's ids without logprobs
                    choice["token_ids"] = [self.token_id] * num_held
                else:
                    ids = [f"token_id:{self.token_id}"] * num_held
                    choice["logprobs"] = {"tokens": ids, "token_logprobs": [-0.1] * num_held}
                num_held = 0
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
        finally:
            task.cancel()  # a client that left: the generation stops, as vLLM aborts it
        yield f"data: {json.dumps({'choices': [], 'usage': self._usage(body)})}\n\n"
        yield "data: [DONE]\n\n"


def main() -> None:
    """Serve a fake upstream on 127.0.0.1 (`benchmarks.serving.manager_path` runs one in a process of its own)."""
    import argparse

    import uvicorn

    from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step-ms", type=float, default=20.0, help="a token's delay")
    args = parser.parse_args()
    fake = FakeOpenAI(resolve_model_folder(DEFAULT_MODEL), step_ms=args.step_ms)
    uvicorn.run(fake.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
