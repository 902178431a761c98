"""`parrot serve | engine | chat`: the servers, and one chat completion on the builtin engine."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import threading
import time
from collections.abc import Callable

from parrot.cli.flags import add_settings_args, resolve
from parrot.cli.settings import ConfigError, build_configs, build_engine_config, effective, nested
from parrot.engine.config import EngineConfig


def _engine_args(p: argparse.ArgumentParser) -> None:
    """Every EngineConfig field as a flag (`--max-num-batched-tokens`, `--latency-prefill-tokens`...)."""
    add_settings_args(p, ("engine",))


def _engine_config(a: argparse.Namespace) -> EngineConfig:
    try:
        return build_engine_config(resolve(a, ("engine",)))
    except ConfigError as e:
        raise SystemExit(f"configuration error: {e}") from None


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


def serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="settings from a TOML or JSON file (tables [serve], [engine], [manager.scheduling], ...)",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the effective settings as a JSON config file and exit"
    )
    add_settings_args(p)


def cmd_serve(a: argparse.Namespace) -> None:
    from parrot.launch import OpenAIUpstream, start_embedded
    from parrot.web.heap import settle_heap

    try:
        configs = build_configs(resolve(a))
    except ConfigError as e:
        raise SystemExit(f"configuration error: {e}") from None
    if a.print_config:
        print(json.dumps(nested(effective(configs)), indent=2))
        return
    serve, manager_config = configs.serve, configs.manager
    engine_configs = [configs.engine] if serve.builtin else []
    upstreams = [
        OpenAIUpstream(
            u, serve.openai_model, serve.openai_tokenizer, serve.openai_api_key, serve.openai_stream_interval
        )
        for u in serve.openai_engines
    ]
    host = serve.host
    if manager_config.auth.open_access:
        if not _is_loopback(host):
            raise SystemExit(
                f"refusing to serve on {host} without API keys: give --api-key / --operator-key, "
                "or bind a loopback address (development mode)"
            )
        print("no API keys configured: development mode, any key is accepted (loopback only)", flush=True)
    emb = start_embedded(engine_configs, list(serve.engine_urls), manager_config, host, serve.port, upstreams)
    settle_heap()
    print(f"parrot manager on {emb.url} (OpenAPI: {emb.url}/docs, dashboard: {emb.url}/dashboard)", flush=True)
    _wait_forever(lambda: emb.stop(grace_s=None))


def cmd_engine(a: argparse.Namespace) -> None:
    from parrot.engine.async_engine import AsyncEngine
    from parrot.engine.server.app import create_engine_app
    from parrot.protocol.engine_api import ENGINE_SECRET_ENV
    from parrot.web.heap import settle_heap
    from parrot.web.server_thread import ServerThread

    engine = AsyncEngine(_engine_config(a))
    engine.start()
    secret = os.environ.get(ENGINE_SECRET_ENV) or None
    if secret is None and not _is_loopback(a.host):
        raise SystemExit(f"refusing to serve the engine API on {a.host} without {ENGINE_SECRET_ENV} set")
    srv = ServerThread(create_engine_app(engine, secret=secret), a.host, a.port).start()
    settle_heap()
    print(f"parrot engine ({engine.model_name}) on {srv.url}", flush=True)

    def stop() -> None:
        srv.stop()
        engine.stop()

    _wait_forever(stop)


def cmd_chat(a: argparse.Namespace) -> None:
    from parrot.engine import sync_client
    from parrot.engine.llm_engine import LLMEngine
    from parrot.protocol import ExtendRequest, SamplingParams

    t0 = time.perf_counter()
    config = _engine_config(a)
    engine = LLMEngine(config)
    engine.start()
    print(f"[loaded {engine.model_name} ({config.dtype}) in {time.perf_counter() - t0:.1f}s]", flush=True)
    try:
        tok = engine.tokenizer
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": a.prompt}]))
        t1 = time.perf_counter()
        h = sync_client.submit(
            engine, ExtendRequest(context_id="chat", token_ids=ids, sampling=SamplingParams(max_tokens=a.max_tokens))
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
