"""Every `parrot` command: serve's settings (flags, TOML and JSON files, errors naming the key and
the allowed values) and serve itself as a process, engine, chat, status, run and bench."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import LiveServer

from parrot.cli import main
from parrot.cli.flags import add_settings_args
from parrot.cli.settings import all_settings
from parrot.engine.attention.registry import backend_names

REPO = Path(__file__).resolve().parents[2]


def settings(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, object]]:
    main(["serve", *argv, "--print-config"])
    return json.loads(capsys.readouterr().out)


def test_serve_settings_defaults_then_file_then_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "parrot.toml"
    toml.write_text(
        '[serve]\nport = 9000\nengine_urls = ["http://10.0.0.2:8100"]\n'
        "[engine]\nlatency_max_batched_tokens = 128\nlatency_prefill_tokens = 256\nengine_aging_s = 1\n"
        '[manager.auth]\napi_keys = ["a"]\n'
        '[manager.scheduling]\ntpot_target_ms = 80\npolicy = "fifo"\n'
        "[manager.sharing]\nprefix_sharing = false\n"
    )
    with pytest.raises(SystemExit) as e:
        settings(capsys, "--config", str(toml))
    assert str(e.value) == (
        "configuration error: engine.engine_aging_s is not a setting; allowed keys in [engine]: aging_s, attention, "
        "batch_invariant, block_size, cpu_kernels, dtype, kv_cache_bytes, latency_max_batched_tokens, "
        "latency_prefill_tokens, max_num_batched_tokens, max_num_seqs, model, name, num_blocks, num_threads, "
        "outranked_chunk_tokens, policy"
    )
    toml.write_text(toml.read_text().replace("engine_aging_s = 1", "aging_s = 1"))
    got = settings(capsys, "--config", str(toml), "--tpot-target-ms", "40", "--latency-prefill-tokens", "none")
    engine, manager, serve = got["engine"], got["manager"], got["serve"]
    assert [serve["port"], serve["host"], serve["engine_urls"]] == [9000, "127.0.0.1", ["http://10.0.0.2:8100"]]
    assert [engine["latency_max_batched_tokens"], engine["latency_prefill_tokens"], engine["aging_s"]] == [
        128,
        None,
        1.0,
    ]
    assert [engine["max_num_batched_tokens"], engine["policy"]] == [2048, "priority"]  # defaults
    scheduling = manager["scheduling"]
    assert [scheduling["tpot_target_ms"], scheduling["policy"], manager["auth"]["api_keys"]] == [40.0, "fifo", ["a"]]
    assert [manager["sharing"]["prefix_sharing"], scheduling["aging_s"]] == [False, 2.0]
    assert list(manager) == ["auth", "limits", "scheduling", "sharing", "engines", "lifecycle"]
    # Both configs' `policy` and `aging_s`: the engine's are --engine-policy / --engine-aging-s.
    got = settings(capsys, "--engine-policy", "fcfs", "--aging-s", "3", "--no-builtin", "--api-key", "x")
    assert [got["engine"]["policy"], got["manager"]["scheduling"]["aging_s"], got["serve"]["builtin"]] == [
        "fcfs",
        3.0,
        False,
    ]
    assert got["manager"]["auth"]["api_keys"] == ["x"]
    # The printed settings are a JSON config file that gives the same settings back, and so is
    # their TOML form (nested tables; TOML has no null, so the unset optional settings are left out).
    printed = tmp_path / "printed.json"
    printed.write_text(json.dumps(got))
    assert settings(capsys, "--config", str(printed)) == got
    as_toml = tmp_path / "printed.toml"
    as_toml.write_text(toml_of(got))
    assert settings(capsys, "--config", str(as_toml)) == got


def toml_of(tables: dict[str, object], name: str = "") -> str:
    """Nested tables as TOML (strings, numbers, booleans and lists of strings; None left out)."""
    lines = [f"[{name}]"] if name else []
    subtables = []
    for key, value in tables.items():
        if isinstance(value, dict):
            subtables.append(toml_of(value, f"{name}.{key}" if name else key))
        elif value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join([*lines, *subtables]) + "\n"


def test_flags_keep_their_names_and_every_setting_has_one() -> None:
    """Flags are the keys with dashes whatever the key's section; the aliases stand beside them."""
    parser = argparse.ArgumentParser()
    add_settings_args(parser)
    flags = {a.dest: a.option_strings for a in parser._actions}
    assert [
        flags["manager.scheduling.tpot_target_ms"],
        flags["manager.scheduling.policy"],
        flags["engine.policy"],
        flags["engine.latency_max_batched_tokens"],
        flags["manager.sharing.prefix_sharing"],
        flags["manager.auth.api_keys"],
        flags["manager.limits.max_sessions_per_tenant"],
        flags["manager.engines.heartbeat_interval_s"],
        flags["manager.lifecycle.shutdown_grace_s"],
    ] == [
        ["--tpot-target-ms"],
        ["--policy"],
        ["--engine-policy"],
        ["--latency-max-batched-tokens"],
        ["--prefix-sharing", "--no-prefix-sharing"],
        ["--api-key"],
        ["--max-sessions-per-tenant"],
        ["--heartbeat-interval-s"],
        ["--shutdown-grace-s"],
    ]
    assert set(all_settings()) <= set(flags)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[engine]\ndtype = "f16"', "engine.dtype: 'f16' is not allowed; allowed values: auto, bfloat16, float32"),
        (
            '[engine]\nattention = "flash"',
            "engine.attention: 'flash' is not allowed; allowed values: {backends}",
        ),
        (
            '[manager.scheduling]\npolicy = "lifo"',
            "manager.scheduling.policy: 'lifo' is not allowed; allowed values: app_centric, fifo",
        ),
        (
            '[manager.scheduling]\ndefault_objective = "speed"',
            "manager.scheduling.default_objective: 'speed' is not allowed; allowed values: 'latency' | 'throughput'",
        ),
        ("[engine]\nmax_num_batched_tokens = 1.5", "engine.max_num_batched_tokens: expected a whole number, got 1.5"),
        ('[serve]\nport = "http"', "serve.port: expected a number (int), got 'http'"),
        ("[manager.scheduling]\nearly_fill = 3", "manager.scheduling.early_fill: expected true or false, got 3"),
        ("[manager.scheduling]\ntpot_target_ms = 0", "manager.scheduling.tpot_target_ms must be > 0"),
        (
            "[manager.sharing]\nprefix_evict_to_free = 0.05",
            "manager.sharing.prefix_evict_below_free: "
            "need 0 <= sharing.prefix_evict_below_free <= sharing.prefix_evict_to_free <= 1",
        ),
        ('[manager.auth]\napi_keys = [""]', "manager.auth.api_keys must be non-empty strings"),
        ("[engine]\nblock_size = 0", "engine.block_size must be >= 1"),
        # A key written in another table (here [manager] itself): the message names the table it belongs in.
        (
            "[manager]\ntpot_target_ms = 80",
            "manager.tpot_target_ms is not a setting; it belongs in [manager.scheduling] "
            "(manager.scheduling.tpot_target_ms)",
        ),
        (
            "[manager.scheduling]\nmax_body_bytes = 80",
            "manager.scheduling.max_body_bytes is not a setting; it belongs in [manager.limits] "
            "(manager.limits.max_body_bytes)",
        ),
        (
            "[manager.scheduling]\nmax_tokens = 80",
            "manager.scheduling.max_tokens is not a setting; allowed keys in [manager.scheduling]: aging_s, "
            "default_objective, early_fill, initial_latency_cap_calls, latency_cap_calls, "
            "max_early_filled_calls_per_engine, max_running_calls_per_engine, objective_deduction, policy, "
            "tpot_floor_slack, tpot_target_ms",
        ),
        (
            "[manager.quotas]\nmax_sessions = 1",
            "manager.quotas is not a table or a setting; the tables in [manager]: auth, limits, scheduling, "
            "sharing, engines, lifecycle",
        ),
        ("[manager]\nscheduling = 5", "manager.scheduling: expected a table of settings, got 5"),
        ("[engines]\nmodel = 1", "engines is not a config section; allowed: serve, engine, manager"),
        (
            "[serve\n",
            "--config: {path} is not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 7)",
        ),
    ],
)
def test_serve_config_errors_name_the_key_and_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        settings(capsys, "--config", str(path))
    assert str(e.value) == "configuration error: " + message.format(path=path, backends=", ".join(backend_names()))


def test_serve_flag_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--policy", "lifo"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "parrot serve: error: argument --policy: manager.scheduling.policy: 'lifo' is not allowed; "
        "allowed values: app_centric, fifo"
    )
    with pytest.raises(SystemExit) as e:
        main(["serve", "--tpot-target-ms", "0", "--print-config"])
    assert str(e.value) == "configuration error: manager.scheduling.tpot_target_ms must be > 0"


def start(cmd: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = re.search(pattern, line)
        if match:
            return proc, match.group(1)
        assert line or proc.poll() is None, "the process exited"
    raise AssertionError("the process did not start")


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_and_engine_processes_take_their_settings(tiny_model_folder: Path, tmp_path: Path) -> None:
    """`parrot engine` serves the engine API and its metrics; `parrot serve --config` over it (no
    builtin engine) applies the file's settings; `parrot status` reads them back."""
    engine_cmd = [sys.executable, "-m", "parrot.cli", "engine", "--model", str(tiny_model_folder)]
    engine_cmd += ["--dtype", "float32", "--num-blocks", "96", "--port", "0"]
    engine, engine_url = start(engine_cmd, r"parrot engine \(tiny\) on (http://\S+)")
    try:
        assert "parrot:num_kv_blocks_free" in httpx.get(f"{engine_url}/metrics").text
        config = tmp_path / "parrot.json"
        config.write_text(
            json.dumps(
                {
                    "serve": {"port": 0, "builtin": False, "engine_urls": [engine_url]},
                    "manager": {"auth": {"operator_keys": ["op"]}, "scheduling": {"latency_cap_calls": 3}},
                }
            )
        )
        serve_cmd = [sys.executable, "-m", "parrot.cli", "serve", "--config", str(config), "--shutdown-grace-s", "1"]
        manager, url = start(serve_cmd, r"parrot manager on (http://\S+)")
        try:
            assert httpx.get(f"{url}/v1/status").status_code == 401  # operator keys from the file
            status = [sys.executable, "-m", "parrot.cli", "status", "--url", url, "--api-key", "op", "--json"]
            out = subprocess.run(status, capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout
            [e] = json.loads(out)["engines"]
            assert [e["model"], e["alive"], e["num_blocks_total"], e["latency_cap"]] == ["tiny", True, 96, 3]
            denied = subprocess.run([*status[:-3], "--api-key", "nope"], capture_output=True, text=True, cwd=REPO)
            assert [denied.returncode, denied.stderr.strip()] == [1, "the manager answered 401: invalid API key"]
        finally:
            assert stop(manager) == 0
    finally:
        assert stop(engine) == 0


def test_chat_prints_the_completion_and_speeds(tiny_model_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["chat", "Hello", "--model", str(tiny_model_folder), "--dtype", "float32", "--max-tokens", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\[loaded tiny \(float32\) in \d+\.\ds\]", lines[0])
    assert re.fullmatch(r"\[prefill \d+ tokens: \d+ tok/s; decode 3 tokens: [\d.]+ tok/s\]", lines[-1])


def test_status_shows_engines_queues_sessions_and_hit_rate(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["status", "--url", server.url])
    out = capsys.readouterr().out
    [engine_id] = server.manager.pool.handles
    assert [t in out for t in ("Engines", "Queues", "Sessions", f" {engine_id} ", " tiny ", " alive ")] == [True] * 6
    assert (
        out.splitlines()[-1]
        == "prefix cache: 0 of 0 prompt tokens reused (hit rate 0.0%); 0 calls finished, 0 tokens generated"
    )
    with pytest.raises(SystemExit) as e:
        main(["status", "--url", "http://127.0.0.1:9"])
    assert str(e.value).startswith("cannot reach the manager at http://127.0.0.1:9: ")


APP = '''
import os, sys
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

SMALL = SamplingParams(max_tokens=4, ignore_eos=True)

@semantic_function(sampling=SMALL)
def summarize(chunk: Input, summary: Output):
    """You are a careful editor. Read the part of the report below and write one short sentence that
    keeps its main fact, names every person it mentions and leaves out opinions and repetitions. Part: {{input:chunk}}
    Sentence:{{output:summary}}"""

@semantic_function(sampling=SMALL)
def combine(a: Input, b: Input, c: Input, summary: Output):
    """Combine {{input:a}} / {{input:b}} / {{input:c}} into one summary:{{output:summary}}"""

with Session(os.environ["PARROT_URL"], api_key=os.environ["PARROT_API_KEY"]) as s:
    result = combine(*[summarize(p) for p in sys.argv[1:]]).get()
print("RESULT", len(result) > 0)
'''


def test_run_an_app_with_progress_and_a_summary(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    main(["run", "--url", server.url, "--interval-s", "0.05", str(app), "Ann sings.", "Bob runs.", "Cy reads."])
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0] == "RESULT True"
    metrics = server.manager.metrics.totals
    assert metrics["calls"] == 4
    assert metrics["gets"] == 1  # the app fetched the result only
    assert re.fullmatch(
        rf"app exited 0 after \d+\.\d s: 4 calls finished, 16 tokens generated; saved 3 client round trips "
        rf"\(1 fetches instead of 4 requests\) and reused {metrics['reused']} of {metrics['prompt']} prompt "
        rf"tokens from shared prefixes \(\d+%\)",
        lines[1],
    )
    assert metrics["reused"] >= 2 * 32  # two of the three maps fork the editor's instructions
    assert "calls" in err and "4/4" in err  # the progress display, on stderr
    with pytest.raises(SystemExit) as e:
        main(["run", "--url", server.url, str(tmp_path / "missing.py")])
    assert str(e.value) == f"no such application file: {tmp_path / 'missing.py'}"


def test_bench_lists_dispatches_and_names_the_allowed_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    main(["bench", "--list"])
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [
        "apps",
        "engine",
        "kernels",
        "attention",
        "attention-prefill",
        "step-profile",
        "tenant-flood",
        "manager-path",
        "invariance",
        "sim-paper",
        "sim-scale",
        "sim-vs-cpu",
        "report",
    ]
    with pytest.raises(SystemExit) as e:
        main(["bench", "fastest"])
    assert str(e.value) == (
        "unknown benchmark 'fastest'; allowed: apps, engine, kernels, attention, attention-prefill, step-profile, "
        "tenant-flood, manager-path, invariance, sim-paper, sim-scale, sim-vs-cpu, report"
    )
    with pytest.raises(SystemExit) as e:
        main(["bench", "apps", "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")
