"""Engine clients for engines an operator registers while serving (`POST /v1/engines`).

`connect_engine` is the `EngineConnector` the launcher hands the manager's app: kind "parrot" is
a Parrot engine server by URL (it says its own model, context length and tokenizer); kind
"openai" is any OpenAI-compatible completion server (vLLM) through the adapter, whose model card
is read now so that each fault names the request field to fix.
"""

from __future__ import annotations

from pathlib import Path

from parrot.backends.http_engine import HttpEngineClient
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.protocol.engine_client import EngineClient, EngineUnavailable
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import RegisterEngineRequest


async def connect_engine(
    req: RegisterEngineRequest, *, has_tokenizer: bool, engine_secret: str | None = None
) -> EngineClient:
    """`engine_secret`: the shared secret of Parrot engine servers (the launcher binds it)."""
    if req.kind == "parrot":
        for name in ("model", "tokenizer", "api_key", "max_model_len"):
            if getattr(req, name) is not None:
                raise ParrotError(f"{name} is for kind 'openai': a Parrot engine says its own", field=name)
        if req.stream_interval != 1:
            raise ParrotError("stream_interval is for kind 'openai'", field="stream_interval")
        return HttpEngineClient(req.url, secret=engine_secret)
    if req.tokenizer is not None and not (Path(req.tokenizer) / "tokenizer.json").is_file():
        raise ParrotError(f"no tokenizer.json in {req.tokenizer!r} on the manager's machine", field="tokenizer")
    client = OpenAIEngineClient(
        req.url, req.model, req.api_key, req.tokenizer, req.max_model_len, stream_interval=req.stream_interval
    )
    try:
        await _check_upstream(client, has_tokenizer)
    except BaseException:
        await client.aclose()
        raise
    return client


async def _check_upstream(client: OpenAIEngineClient, has_tokenizer: bool) -> None:
    try:
        info = await client.info()
    except EngineUnavailable as e:
        raise ParrotError(f"cannot reach the upstream: {e.message}", field="url") from e
    except ParrotError as e:
        if e.status in (401, 403):
            raise ParrotError(f"the upstream refused the key: {e.message}", field="api_key") from e
        raise
    if info["model_folder"] is None and not has_tokenizer:
        raise ParrotError(
            "the upstream's model card names no folder on this machine: give the model's tokenizer folder",
            field="tokenizer",
        )
