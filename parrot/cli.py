"""Command line: `parrot serve | engine | chat` (`make demo` runs `python -m examples`).

parrot serve   # manager + builtin engine on the default model (embedded mode), HTTP on :8000
parrot serve --no-builtin --openai-engine http://127.0.0.1:8001 --openai-tokenizer smollm2-135m
               # the manager over a vLLM server (any OpenAI-compatible one) instead
parrot engine  # a builtin engine alone, serving the engine API (to join a manager by URL)
parrot chat "question"   # one streamed chat completion on the builtin engine, with speeds
parrot demo    # embedded mode + the example applications on a public-domain document
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from parrot.engine.config import EngineConfig


def _engine_args(p: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    p.add_argument("--model", default=d.model, help="model name, Hugging Face folder or .gguf file")
    p.add_argument("--dtype", default=d.dtype, choices=["bfloat16", "float32"])
    p.add_argument("--kv-cache-bytes", type=int, default=d.kv_cache_bytes)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--attention", default=d.attention, help="attention backend: paged | shared_prefix")
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    p.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=d.batch_invariant,
        help="a sequence's output does not depend on its batch, chunking or forked prefix "
        "(default: on where the native CPU kernels run)",
    )
    p.add_argument("--threads", type=int, default=None)


def _engine_config(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=a.model,
        dtype=a.dtype,
        kv_cache_bytes=a.kv_cache_bytes,
        block_size=a.block_size,
        attention=a.attention,
        max_num_batched_tokens=a.max_num_batched_tokens,
        batch_invariant=a.batch_invariant,
        num_threads=a.threads,
    )


def _wait_forever(stop: Callable[[], None]) -> None:
    """Until SIGTERM or SIGINT, then `stop()` once (a second signal during it exits at once)."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            raise SystemExit(128 + signum)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while not stopping.wait(1.0):
        pass
    print("shutting down: draining calls in flight, then closing sessions", flush=True)
    stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(a: argparse.Namespace) -> None:
    from parrot.launch import OpenAIUpstream, start_embedded
    from parrot.serve.config import ManagerConfig

    configs = [] if a.no_builtin else [_engine_config(a)]
    upstreams = [OpenAIUpstream(u, a.openai_model, a.openai_tokenizer, a.openai_api_key) for u in a.openai_engine]
    manager_config = ManagerConfig(
        api_keys=tuple(a.api_key),
        operator_keys=tuple(a.operator_key),
        engine_url_allowlist=tuple(a.engine_url_allow),
        shutdown_grace_s=a.shutdown_grace_s,
        policy=a.policy,
        prefix_sharing=not a.no_prefix_sharing,
        objective_deduction=not a.no_objective_deduction,
        tpot_target_ms=a.tpot_target_ms,
        context_lease_s=a.context_lease_s,
    )
    if manager_config.open_access:
        if not _is_loopback(a.host):
            raise SystemExit(
                f"refusing to serve on {a.host} without API keys: give --api-key / --operator-key, "
                "or bind a loopback address (development mode)"
            )
        print("no API keys configured: development mode, any key is accepted (loopback only)", flush=True)
    emb = start_embedded(configs, a.engine_url, manager_config, a.host, a.port, upstreams)
    print(f"parrot manager on {emb.url} (OpenAPI: {emb.url}/docs)", flush=True)
    _wait_forever(lambda: emb.stop(grace_s=None))


def cmd_engine(a: argparse.Namespace) -> None:
    from parrot.engine.async_engine import AsyncEngine
    from parrot.engine.server.app import create_engine_app
    from parrot.protocol.engine_api import ENGINE_SECRET_ENV
    from parrot.web.server_thread import ServerThread

    engine = AsyncEngine(_engine_config(a))
    engine.start()
    secret = os.environ.get(ENGINE_SECRET_ENV) or None
    if secret is None and not _is_loopback(a.host):
        raise SystemExit(f"refusing to serve the engine API on {a.host} without {ENGINE_SECRET_ENV} set")
    srv = ServerThread(create_engine_app(engine, secret=secret), a.host, a.port).start()
    print(f"parrot engine ({engine.model_name}) on {srv.url}", flush=True)

    def stop() -> None:
        srv.stop()
        engine.stop()

    _wait_forever(stop)


def cmd_chat(a: argparse.Namespace) -> None:
    from parrot.engine import sync_client
    from parrot.engine.llm_engine import LLMEngine
    from parrot.protocol import FillRequest, GenerateRequest, SamplingParams

    t0 = time.perf_counter()
    engine = LLMEngine(_engine_config(a))
    engine.start()
    print(f"[loaded {engine.model_name} ({a.dtype}) in {time.perf_counter() - t0:.1f}s]", flush=True)
    try:
        tok = engine.tokenizer
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": a.prompt}]))
        t1 = time.perf_counter()
        sync_client.fill(engine, FillRequest(context_id="chat", token_ids=ids))
        h = sync_client.submit_generate(
            engine, GenerateRequest(context_id="chat", sampling=SamplingParams(max_tokens=a.max_tokens))
        )
        n, t_first = 0, None
        while True:
            ev = h.events.get(timeout=300)
            if not hasattr(ev, "finish_reason"):
                raise SystemExit(f"error: {ev}")
            if t_first is None:
                t_first = time.perf_counter()
            n += 1
            print(ev.text, end="", flush=True)  # type: ignore[union-attr]
            if ev.finish_reason is not None:  # type: ignore[union-attr]
                break
        t2 = time.perf_counter()
        assert t_first is not None
        print(
            f"\n[prefill {len(ids)} tokens: {len(ids) / (t_first - t1):.0f} tok/s; "
            f"decode {n} tokens: {max(n - 1, 1) / max(t2 - t_first, 1e-9):.1f} tok/s]"
        )
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="parrot", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="manager + builtin engine (embedded mode)")
    _engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--engine-url", action="append", default=[], help="also use an engine started elsewhere")
    p.add_argument(
        "--openai-engine",
        action="append",
        default=[],
        metavar="URL",
        help="also use an OpenAI-compatible server (vLLM) as an engine, through the adapter",
    )
    p.add_argument("--openai-model", help="the --openai-engine model name (default: the first it lists)")
    p.add_argument(
        "--openai-tokenizer",
        help="the --openai-engine model's tokenizer: a local folder or a model name (smollm2-135m); "
        "default: the upstream model card's root, when that is a folder here",
    )
    p.add_argument("--openai-api-key", help="the --openai-engine API key")
    p.add_argument(
        "--no-builtin", action="store_true", help="no builtin engine: only --engine-url / --openai-engine engines"
    )
    p.add_argument("--api-key", action="append", default=[], help="accepted tenant API key (repeatable)")
    p.add_argument(
        "--operator-key", action="append", default=[], help="operator API key: may also register/remove engines"
    )
    p.add_argument(
        "--engine-url-allow", action="append", default=[], help="URL prefix an operator may register engines under"
    )
    p.add_argument(
        "--shutdown-grace-s", type=float, default=30.0, help="on SIGTERM/SIGINT, let calls in flight finish this long"
    )
    p.add_argument("--policy", default="app_centric", choices=["app_centric", "fifo"], help="scheduling policy")
    p.add_argument("--no-prefix-sharing", action="store_true", help="never fork calls from cached prefixes")
    p.add_argument("--no-objective-deduction", action="store_true", help="every call gets the default objective")
    p.add_argument("--tpot-target-ms", type=float, default=50.0, help="latency-critical time per output token")
    p.add_argument(
        "--context-lease-s", type=float, default=60.0, help="engines free this run's contexts this long after it dies"
    )
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("engine", help="builtin engine alone, serving the engine API")
    _engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.set_defaults(fn=cmd_engine)
    p = sub.add_parser("chat", help="one streamed chat completion on the builtin engine")
    _engine_args(p)
    p.add_argument("prompt", nargs="?", default="Give me three tips for writing clear code.")
    p.add_argument("--max-tokens", type=int, default=96)
    p.set_defaults(fn=cmd_chat)
    a = parser.parse_args(argv)
    a.fn(a)


if __name__ == "__main__":
    main(sys.argv[1:])
