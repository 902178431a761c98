"""Objective deduction on hand-built DAGs: exact objectives, urgencies and task groups."""

from __future__ import annotations

from parrot.protocol.objective import Criteria, Objective
from parrot.protocol.public_api import Binding, CallSpec
from parrot.protocol.template import parse_template
from parrot.serve.policy.objectives import DagCall, Deduction, deduce
from parrot.serve.runtime.deduction import deduce_session
from parrot.serve.runtime.graph import SessionGraph

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT


def call(call_id: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> DagCall:
    return DagCall(call_id, inputs, outputs)


MAP_REDUCE = [
    call("m0", ("doc0",), ("s0",)),
    call("m1", ("doc1",), ("s1",)),
    call("m2", ("doc2",), ("s2",)),
    call("r", ("s0", "s1", "s2"), ("summary",)),
]


def test_map_reduce_maps_form_a_throughput_group_and_the_reduce_is_latency() -> None:
    got = deduce(MAP_REDUCE, {"summary": Criteria.LATENCY})
    group = Deduction(TPUT, Criteria.LATENCY, "r", 1)
    assert got == {"m0": group, "m1": group, "m2": group, "r": Deduction(LAT, Criteria.LATENCY, None, 1)}


def test_map_reduce_before_any_get_and_with_a_throughput_get() -> None:
    # Nobody asked yet: the group is still batched for throughput; the reduce gets the default.
    got = deduce(MAP_REDUCE, {})
    assert got["m0"] == Deduction(TPUT, None, "r", 0)
    assert got["r"] == Deduction(LAT, None, None, 0)
    assert deduce(MAP_REDUCE, {}, default=TPUT)["r"] == Deduction(TPUT, None, None, 0)
    got = deduce(MAP_REDUCE, {"summary": Criteria.THROUGHPUT})
    assert got["m1"] == Deduction(TPUT, Criteria.THROUGHPUT, "r", 0)
    assert got["r"] == Deduction(TPUT, Criteria.THROUGHPUT, None, 0)


def test_a_chain_is_latency_critical_end_to_end() -> None:
    chain = [call("c0", ("in",), ("a",)), call("c1", ("a",), ("b",)), call("c2", ("b",), ("c",))]
    got = deduce(chain, {"c": Criteria.LATENCY})
    assert got == {c: Deduction(LAT, Criteria.LATENCY, None, 1) for c in ("c0", "c1", "c2")}
    got = deduce(chain, {"c": Criteria.THROUGHPUT})
    assert got == {c: Deduction(TPUT, Criteria.THROUGHPUT, None, 0) for c in ("c0", "c1", "c2")}
    # Asking for the middle with latency makes the head latency too, the tail keeps the default.
    got = deduce(chain, {"b": Criteria.LATENCY})
    assert [got[c].objective for c in ("c0", "c1", "c2")] == [LAT, LAT, LAT]
    assert got["c2"].urgency is None


def test_a_split_before_a_group_is_on_the_critical_path() -> None:
    dag = [
        call("split", ("doc",), ("p0", "p1")),
        call("m0", ("p0",), ("s0",)),
        call("m1", ("p1",), ("s1",)),
        call("r", ("s0", "s1"), ("out",)),
    ]
    got = deduce(dag, {"out": Criteria.LATENCY})
    assert got["split"] == Deduction(LAT, Criteria.LATENCY, None, 1)
    assert got["m0"] == got["m1"] == Deduction(TPUT, Criteria.LATENCY, "r", 1)


def test_latency_wins_when_a_group_member_is_also_awaited_or_sole_producer() -> None:
    dag = [*MAP_REDUCE, call("x", ("s1",), ("detail",))]
    got = deduce(dag, {"summary": Criteria.THROUGHPUT, "detail": Criteria.LATENCY})
    assert got["m1"] == Deduction(LAT, Criteria.LATENCY, "r", 1)  # x waits on m1 alone
    assert got["m0"] == Deduction(TPUT, Criteria.THROUGHPUT, "r", 0)
    got = deduce(MAP_REDUCE, {"summary": Criteria.THROUGHPUT, "s2": Criteria.LATENCY})
    assert got["m2"] == Deduction(LAT, Criteria.LATENCY, "r", 1)


def test_a_member_of_two_groups_joins_the_more_urgent() -> None:
    dag = [
        call("a", (), ("va",)),
        call("b", (), ("vb",)),
        call("c", (), ("vc",)),
        call("g1", ("va", "vb"), ("o1",)),
        call("g2", ("vb", "vc"), ("o2",)),
    ]
    got = deduce(dag, {"o1": Criteria.THROUGHPUT, "o2": Criteria.LATENCY})
    assert [got["a"].task_group, got["b"].task_group, got["c"].task_group] == ["g1", "g2", "g2"]
    assert got["b"] == Deduction(TPUT, Criteria.LATENCY, "g2", 1)


def test_submission_order_need_not_be_topological() -> None:
    # c0 reads `x`, which c1 (submitted later) produces: deduction follows the edges, not the order.
    dag = [call("c0", ("x",), ("y",)), call("c1", ("in",), ("x",))]
    got = deduce(dag, {"y": Criteria.THROUGHPUT})
    assert got["c1"] == Deduction(TPUT, Criteria.THROUGHPUT, None, 0)


def test_deduce_session_reads_the_graph_and_the_gets() -> None:
    graph = SessionGraph()
    specs = [
        (CallSpec(template="A {{input:d}} {{output:s}}", bindings={"d": Binding(value="1")}), "m"),
        (CallSpec(template="B {{input:d}} {{output:s}}", bindings={"d": Binding(value="2")}), "m"),
        (
            CallSpec(
                template="C {{input:a}} {{input:b}} {{output:r}}",
                bindings={"a": Binding(var_id="c0~s"), "b": Binding(var_id="c1~s")},
            ),
            "m",
        ),
    ]
    graph.commit(graph.stage([], [(spec, parse_template(spec.template), model) for spec, model in specs]))
    graph.variables["c2~r"].criteria = Criteria.LATENCY
    got = deduce_session(graph)
    assert got["c0"] == got["c1"] == Deduction(TPUT, Criteria.LATENCY, "c2", 1)
    assert got["c2"] == Deduction(LAT, Criteria.LATENCY, None, 1)
