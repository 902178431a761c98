"""The guides say what the code does: every `parrot` command line in them parses, the operator
guide's config file is a valid one, every setting it names exists (by its path:
`manager.scheduling.tpot_target_ms`), its quota table gives the defaults, and its metric tables list
exactly the metrics the manager and an engine server export, each with its type and labels (scraped
after some work, so every family has samples). The user guide's Python runs as
tests/serve/test_docs.py; tests/serve/test_cli_reference.py checks the configuration reference."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import httpx
from live_server import LiveServer
from prometheus_client.parser import text_string_to_metric_families

from parrot.cli import build_parser
from parrot.cli.flags import resolve
from parrot.cli.settings import TABLES, all_settings, build_configs, defaults, read_config_file
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.app import create_engine_app
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.web.server_thread import ServerThread

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "operator_guide.md"
Exported = dict[str, tuple[str, frozenset[str]]]  # name as queried -> (type, label names)


def table(text: str, header: list[str]) -> list[list[str]]:
    """The rows of the Markdown table whose header is `header`, cells stripped of backticks."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if _cells(line) == header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _cells(line: str) -> list[str]:
    return [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]


def exported(metrics_text: str) -> Exported:
    out = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name.endswith("_created"):  # prometheus-client's creation time of each counter and histogram
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        assert family.samples, f"{name} has no samples: the test's work should produce some"
        out[name] = (family.type, frozenset(labels))
    return out


def documented(rows: list[list[str]]) -> Exported:
    out = {}
    for name, kind, labels, _meaning in rows:
        assert name not in out, f"{name} is listed twice"
        out[name] = (kind, frozenset(label.strip() for label in labels.split(",") if label.strip()))
    return out


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def parrot_commands(script: str) -> list[list[str]]:
    """The `parrot ...` command lines of a shell block (continuations joined; comments, environment
    assignments and `.venv/bin/` left out), each as its arguments after `parrot`."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words.pop(0)
        if words and words[0].removeprefix(".venv/bin/") == "parrot":
            commands.append(words[1:])
    return commands


def test_every_parrot_command_line_in_the_guides_parses() -> None:
    commands = [
        c
        for guide in ("user_guide.md", "operator_guide.md")
        for b in blocks((DOCS / guide).read_text(), "bash")
        for c in parrot_commands(b)
    ]
    assert {c[0] for c in commands} == {"serve", "engine", "status", "run", "chat", "bench"}
    for argv in commands:
        build_parser().parse_args(argv)  # an unknown flag or a bad value exits


def test_the_config_file_example_is_a_valid_config(tmp_path: Path) -> None:
    (example,) = blocks(GUIDE.read_text(), "toml")
    path = tmp_path / "parrot.toml"
    path.write_text(example)
    assert read_config_file(path)["manager.scheduling.tpot_target_ms"] == 80
    configs = build_configs(resolve(build_parser().parse_args(["serve", "--config", str(path)])))
    assert [configs.engine.latency_max_batched_tokens, configs.manager.auth.operator_keys] == [128, ("ops-secret",)]
    assert configs.manager.scheduling.tpot_target_ms == 80


def test_every_setting_the_guide_names_exists() -> None:
    """A setting is named by its path (`engine.dtype`, `manager.limits.max_sessions`); a table may be
    named too (`manager.scheduling`)."""
    named = re.findall(r"`((?:serve|engine|manager)\.[a-z_0-9.]+)`", GUIDE.read_text())
    assert len(named) > 30
    assert [n for n in named if n not in all_settings() and n not in TABLES] == []


def test_the_quota_table_gives_the_defaults() -> None:
    rows = table(GUIDE.read_text(), ["setting", "default", "past it"])
    stated = {name: float(default.replace(",", "")) for name, default, _ in rows}
    assert stated == {name: float(defaults()[name]) for name in stated}
    limits = ("max_sessions_per_tenant", "max_tokens_in_flight_per_tenant", "max_body_bytes")
    assert {f"manager.limits.{name}" for name in limits} <= set(stated)


@semantic_function(sampling=SamplingParams(max_tokens=4, ignore_eos=True))
def review(topic: Input, text: Output):
    """You review short product notes. Write one plain sentence, no lists, no emoji, no quotes, and
    keep it under twenty words. The note is about {{input:topic}}.
    Review:{{output:text}}"""


def test_the_manager_metric_table_is_what_the_manager_exports(server: LiveServer) -> None:
    with Session(server.url) as s:
        reviews = review.samples(3, "umbrellas")  # forks of one filled prompt: reuse by source
        assert all(isinstance(r.get(), str) for r in reviews)
        assert sum(c.num_cached_tokens for c in s.status().calls) > 0
        scraped = exported(httpx.get(f"{server.url}/metrics").text)  # while the session lives
    rows = table(GUIDE.read_text(), ["manager metric", "type", "labels", "meaning"])
    assert documented(rows) == scraped


def test_the_engine_metric_table_is_what_an_engine_server_exports(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as srv:
        fill = {"context_id": "doc-parent", "token_ids": list(range(10, 50))}
        assert httpx.post(f"{srv.url}/v1/engine/extend", json=fill).status_code == 200
        body = {"context_id": "doc-parent", "append": True, "sampling": {"max_tokens": 3, "ignore_eos": True}}
        with httpx.stream("POST", f"{srv.url}/v1/engine/extend", json=body) as stream:
            assert len(list(stream.iter_lines())) == 3
        assert httpx.get(f"{srv.url}/v1/engine/stats").status_code == 200
        scraped = exported(httpx.get(f"{srv.url}/metrics").text)
        httpx.post(f"{srv.url}/v1/engine/free", json={"context_id": "doc-parent"})
    rows = table(GUIDE.read_text(), ["engine metric", "type", "labels", "meaning"])
    assert documented(rows) == scraped
