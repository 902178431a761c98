"""Command line: `parrot serve | engine | chat | status | run | bench` (`make demo` runs `python -m examples`).

parrot serve [--config FILE]   # manager + builtin engine on the default model (embedded mode), HTTP on :8000;
                               # every engine and manager setting is a flag and a config-file key
parrot serve --no-builtin --openai-engine http://127.0.0.1:8001 --openai-tokenizer smollm2-135m
                               # the manager over a vLLM server (any OpenAI-compatible one) instead
parrot engine                  # a builtin engine alone, serving the engine API (to join a manager by URL)
parrot chat "question"         # one streamed chat completion on the builtin engine, with speeds
parrot status                  # a manager's engines, sessions, queues and prefix-cache hit rate
parrot run app.py [ARGS]       # run an application against a manager, with a live display of its calls
parrot bench NAME [ARGS]       # a benchmark (parrot bench --list)
"""

from __future__ import annotations

import argparse
import sys

from parrot.cli.bench import bench_args, cmd_bench
from parrot.cli.run import cmd_run, run_args
from parrot.cli.servers import _engine_args, _engine_config, cmd_chat, cmd_engine, cmd_serve, serve_args
from parrot.cli.status import cmd_status, status_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parrot", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="manager + builtin engine (embedded mode)")
    serve_args(p)
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
    p = sub.add_parser("status", help="a manager's engines, sessions, queues and prefix-cache hit rate")
    status_args(p)
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("run", help="run an application against a manager, with a progress display")
    run_args(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("bench", help="the benchmarks (parrot bench --list)")
    bench_args(p)
    p.set_defaults(fn=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    a.fn(a)


__all__ = ["_engine_args", "_engine_config", "build_parser", "main"]
