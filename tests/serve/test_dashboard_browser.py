"""The web dashboard in a real headless browser (Playwright driving Debian's chromium): a running
map-reduce's DAG appears (calls and variables, laid out by Graphviz), its engine row shows load and
KV use, and the DAG updates as the reduce runs. Screenshots are kept as test artifacts under
`test-artifacts/dashboard/` (git-ignored)."""

from __future__ import annotations

import shutil
from pathlib import Path

from live_server import LiveServer
from playwright.sync_api import Page, sync_playwright

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SMALL = SamplingParams(max_tokens=4, ignore_eos=True)


@semantic_function(sampling=SMALL)
def summarize(chunk: Input, summary: Output):
    """Summarize this part: {{input:chunk}}
    Summary:{{output:summary}}"""


@semantic_function(sampling=SMALL)
def combine(a: Input, b: Input, c: Input, note: Input, summary: Output):
    """Combine {{input:a}} / {{input:b}} / {{input:c}} ({{input:note}}) into one summary:{{output:summary}}"""


def call_classes(page: Page) -> dict[str, str]:
    """Call node id -> its SVG class (`node call state_done objective_latency`)."""
    return page.eval_on_selector_all(
        "#dag svg g.node.call", "els => Object.fromEntries(els.map(e => [e.id, e.getAttribute('class')]))"
    )


def test_dashboard_shows_a_running_map_reduce(server: LiveServer) -> None:
    assert shutil.which("dot") and Path(CHROMIUM).exists(), "make test installs chromium and graphviz"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Session(server.url, api_key="k") as s:
        note = s.variable("note")  # the reduce waits for it: the test sets it once the browser saw the DAG
        reduced = combine(*[summarize(p) for p in ("Ann sings.", "Bob runs.", "Cy reads.")], note)
        s.flush()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{server.url}/dashboard?session={s.session_id}&interval_ms=200")
                # The maps finish; the reduce waits for `note`: the DAG shows exactly that.
                page.wait_for_function(
                    "document.querySelectorAll('#dag svg g.node.call.state_done').length === 3", timeout=60_000
                )
                before = call_classes(page)
                assert sorted(before) == ["c0", "c1", "c2", "c3"]
                assert [before[c].split()[:3] for c in ("c0", "c1", "c2", "c3")] == [
                    ["node", "call", "state_done"],
                    ["node", "call", "state_done"],
                    ["node", "call", "state_done"],
                    ["node", "call", "state_waiting"],
                ]
                assert (
                    page.locator("#dag svg g.node.variable").count() == 3 + 3 + 1 + 1
                )  # chunks, summaries, note, result
                assert page.locator("#dag svg g.edge").count() == 3 + 3 + 4 + 1
                [engine_id] = server.manager.pool.handles
                row = page.locator(f'#engines tr[data-engine="{engine_id}"]')
                assert row.locator("td").nth(2).inner_text() == "alive"
                assert "%" in row.locator("td").nth(5).inner_text()
                assert page.locator(f'#sessions tr.selected[data-session="{s.session_id}"]').count() == 1
                page.screenshot(path=str(ARTIFACTS / "map_reduce_waiting.png"), full_page=True)

                note.set("keep it short")
                page.wait_for_function(
                    "document.querySelectorAll('#dag svg g.node.call.state_done').length === 4", timeout=60_000
                )
                after = call_classes(page)
                assert after["c3"].split()[:3] == ["node", "call", "state_done"]
                run = server.manager.sessions.sessions[s.session_id].runs["c3"]
                assert after["c3"].split()[3] == f"objective_{run.objective.value}"
                calls_row = page.locator('#calls tr[data-call="c3"] td')
                assert [calls_row.nth(1).inner_text(), calls_row.nth(3).inner_text()] == ["done", engine_id]
                assert calls_row.nth(6).inner_text() == "4"
                assert page.locator("#error").inner_text() == ""
                page.screenshot(path=str(ARTIFACTS / "map_reduce_done.png"), full_page=True)
            finally:
                browser.close()
        assert reduced.get() != ""
    assert (ARTIFACTS / "map_reduce_done.png").stat().st_size > 10_000
