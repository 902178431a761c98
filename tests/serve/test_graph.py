"""The session DAG: staging checks (nothing changes on a refusal), commit, producer/consumer edges."""

from __future__ import annotations

import pytest

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import parse_template
from parrot.serve.runtime.graph import SessionGraph


def call(template: str, **bindings: Binding) -> tuple[CallSpec, object, str]:
    spec = CallSpec(template=template, bindings=bindings)
    return spec, parse_template(template), "m"


def var(var_id: str) -> Binding:
    return Binding(var_id=var_id)


def add(graph: SessionGraph, variables: list[VariableSpec], calls: list[tuple]) -> None:
    graph.commit(graph.stage(variables, calls))


def snapshot(graph: SessionGraph) -> tuple:
    return (
        {k: (v.value, v.producer_call_id, tuple(v.consumer_call_ids)) for k, v in graph.variables.items()},
        sorted(graph.calls),
    )


def test_chain_edges_and_generated_ids() -> None:
    graph = SessionGraph()
    add(
        graph,
        [VariableSpec(var_id="doc", value="text"), VariableSpec(name="free")],
        [
            call("Sum {{input:d}}:{{output:s}}", d=var("doc")),
            call("Again {{input:s}} {{input:s2}}:{{output:t}}", s=var("c0~s"), s2=Binding(value="inline")),
        ],
    )
    assert sorted(graph.variables) == ["c0~s", "c1~s2", "c1~t", "doc", "v~0"]
    assert graph.variables["v~0"].name == "free"
    assert graph.variables["c0~s"].producer_call_id == "c0"
    assert graph.variables["c0~s"].consumer_call_ids == ["c1"]
    assert graph.variables["doc"].consumer_call_ids == ["c0"]
    assert graph.variables["doc"].producer_call_id is None
    assert graph.variables["c1~s2"].value == "inline"
    assert graph.calls["c1"].inputs == {"s": "c0~s", "s2": "c1~s2"}
    assert graph.calls["c1"].outputs == {"t": "c1~t"}
    # The next generated variable id continues the count.
    add(graph, [VariableSpec()], [])
    assert "v~1" in graph.variables


def test_output_bound_to_existing_variable_and_per_output_sampling() -> None:
    graph = SessionGraph()
    fast = SamplingParams(max_tokens=3)
    spec = CallSpec(
        template="{{input:a}} x {{output:o1}} y {{output:o2}}",
        bindings={"a": Binding(value="A"), "o1": var("out")},
        sampling={"o1": fast},
        default_sampling=SamplingParams(max_tokens=9),
    )
    add(graph, [VariableSpec(var_id="out")], [(spec, parse_template(spec.template), "m")])
    node = graph.calls["c0"]
    assert node.outputs == {"o1": "out", "o2": "c0~o2"}
    assert node.sampling == {"o1": fast, "o2": SamplingParams(max_tokens=9)}
    assert graph.variables["out"].producer_call_id == "c0"


@pytest.mark.parametrize(
    ("variables", "calls", "status", "field", "needle"),
    [
        ([VariableSpec(var_id="x"), VariableSpec(var_id="x")], [], 409, "variables[1].var_id", "already exists"),
        ([], [call("A {{input:a}}{{output:o}}", a=var("nope"))], 404, "calls[0].bindings.a.var_id", "unknown"),
        ([], [call("A {{input:a}}{{output:o}}")], 400, "calls[0].bindings.a", "has no binding"),
        (
            [],
            [call("A {{input:a}}{{output:o}}", a=Binding(value="v"), zz=Binding(value="v"))],
            400,
            "calls[0].bindings.zz",
            "names no placeholder",
        ),
        (
            [VariableSpec(var_id="set", value="v")],
            [call("A {{output:o}}", o=var("set"))],
            409,
            "calls[0].bindings.o.var_id",
            "already set",
        ),
        (
            [VariableSpec(var_id="o")],
            [call("A {{output:o}}", o=var("o")), call("B {{output:p}}", p=var("o"))],
            409,
            "calls[1].bindings.p.var_id",
            "already the output of call 'c1'",
        ),
        ([], [call("A {{output:o}}", o=Binding(value="v"))], 400, "calls[0].bindings.o.value", "cannot take a value"),
        (
            [VariableSpec(var_id="x")],
            [call("A {{input:a}} {{output:o}}", a=var("x"), o=var("x"))],
            400,
            "calls[0].bindings",
            "dependency cycle through calls c1 -> c1",
        ),
        (
            [VariableSpec(var_id="x"), VariableSpec(var_id="y")],
            [
                call("A {{input:a}} {{output:o}}", a=var("x"), o=var("y")),
                call("B {{input:b}} {{output:p}}", b=var("y"), p=var("x")),
            ],
            400,
            "calls[0].bindings",
            "dependency cycle through calls c1 -> c2 -> c1",
        ),
    ],
)
def test_bad_batches_are_refused_and_change_nothing(variables, calls, status, field, needle) -> None:
    graph = SessionGraph()
    add(graph, [VariableSpec(var_id="base", value="b")], [call("S {{input:a}}{{output:o}}", a=var("base"))])
    before = snapshot(graph)
    with pytest.raises(ParrotError) as info:
        graph.stage(variables, calls)
    assert [info.value.status, info.value.field] == [status, field]
    assert needle in info.value.message
    assert snapshot(graph) == before


def test_sampling_for_a_non_output_is_refused() -> None:
    graph = SessionGraph()
    spec = CallSpec(
        template="A {{input:a}} {{output:o}}", bindings={"a": Binding(value="1")}, sampling={"a": SamplingParams()}
    )
    with pytest.raises(ParrotError) as info:
        graph.stage([], [(spec, parse_template(spec.template), "m")])
    assert info.value.field == "calls[0].sampling.a"


def test_cycle_through_committed_calls_is_refused() -> None:
    graph = SessionGraph()
    # c0 reads x and writes y; x has no producer yet.
    add(
        graph,
        [VariableSpec(var_id="x"), VariableSpec(var_id="y")],
        [call("A {{input:a}} {{output:o}}", a=var("x"), o=var("y"))],
    )
    add(graph, [], [call("B {{input:b}} {{output:o}}", b=var("y"))])  # c1 reads y
    before = snapshot(graph)
    # c2 reads c1's output and would write x: c0 -> c1 -> c2 -> c0.
    with pytest.raises(ParrotError, match="dependency cycle through calls c2 -> c0 -> c1 -> c2"):
        graph.stage([], [call("C {{input:c}} {{output:o}}", c=var("c1~o"), o=var("x"))], call_field_prefix="")
    assert snapshot(graph) == before
