"""The operator views on hand-built inputs: a DAG's DOT text (what Graphviz lays out for the
dashboard), and the SVG route's limit on the DAGs it draws."""

from __future__ import annotations

import httpx
import pytest
from live_server import LiveServer

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.protocol.ops_api import DagEdge, DagNode, SessionDag
from parrot.serve.http import ops
from parrot.serve.runtime.overview import dag_dot


def test_dag_dot_names_each_node_by_id_and_classes_by_kind_state_objective() -> None:
    dag = SessionDag(
        session_id="s-1",
        nodes=[
            DagNode(node_id="doc", kind="variable", label='the "doc"', state="ready"),
            DagNode(
                node_id="c0",
                kind="call",
                label="summarize",
                state="running",
                objective="throughput",
                engine_id="e0",
                run_s=1.5,
                num_generated_tokens=3,
                num_cached_tokens=40,
            ),
        ],
        edges=[DagEdge(src="doc", dst="c0")],
    )
    assert dag_dot(dag).splitlines() == [
        "digraph dag {",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=10, style=filled];',
        '  "doc" [id="doc", class="variable state_ready", fillcolor="#bbf7d0", shape="ellipse", '
        'label="the \\"doc\\""];',
        '  "c0" [id="c0", class="call state_running objective_throughput", fillcolor="#fde68a", shape="box", '
        'label="summarize\\nrunning throughput on e0 1.50s", color="#2563eb", penwidth="2", '
        'tooltip="c0: 3 tokens generated, 40 reused"];',
        '  "doc" -> "c0";',
        "}",
    ]


@semantic_function(sampling=SamplingParams(max_tokens=2, ignore_eos=True))
def echo(text: Input, out: Output):
    """Echo {{input:text}}:{{output:out}}"""


def test_the_svg_route_refuses_dags_over_its_limit(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "MAX_SVG_NODES", 3)
    with Session(server.url, api_key="k") as s:
        echo("a").get()  # 3 nodes: input, call, output
        url = f"{server.url}/v1/status/sessions/{s.session_id}/dag.svg"
        assert httpx.get(url).status_code == 200
        echo("b").get()
        r = httpx.get(url)
    assert [r.status_code, r.json()["error"]["field"]] == [422, "session_id"]
    assert r.json()["error"]["message"] == ("the DAG has 6 nodes, more than the 3 drawn; read it as JSON at .../dag")
