"""The FIFO policy on hand-built snapshots: exact plans."""

from __future__ import annotations

import pytest

from parrot.protocol.errors import ParrotError
from parrot.serve.policy.fifo import FifoPolicy
from parrot.serve.policy.plan import CallView, Dispatch, EarlyFill, EngineView, FailCall, Plan, Snapshot
from parrot.serve.policy.registry import make_policy


def view(call_id: str, order: int, **kw: object) -> CallView:
    fields: dict[str, object] = {
        "key": ("s", call_id),
        "model": "m",
        "order": order,
        "inputs_ready": False,
        "failed_var_id": None,
        "num_ready_pieces": 0,
        "num_filled_pieces": 0,
        "engine_id": None,
    }
    fields.update(kw)
    return CallView(**fields)  # type: ignore[arg-type]


def engine(engine_id: str, running: int = 0, early: int = 0, model: str = "m", cap: int = 2, early_cap: int = 2):
    return EngineView(engine_id, model, running, cap, early, early_cap)


def test_ready_calls_go_in_order_to_the_least_loaded_engine_until_capacity() -> None:
    snap = Snapshot(
        calls=(
            view("c2", 2, inputs_ready=True),
            view("c0", 0, inputs_ready=True),
            view("c1", 1, inputs_ready=True),
            view("c3", 3, inputs_ready=True),
        ),
        engines=(engine("e0", running=1), engine("e1")),
    )
    plan = FifoPolicy().plan(snap)
    assert plan == Plan(
        dispatch=(Dispatch(("s", "c0"), "e1"), Dispatch(("s", "c1"), "e0"), Dispatch(("s", "c2"), "e1")),
        blocked=(("s", "c3"),),
    )


def test_failed_inputs_fail_and_early_fill_covers_the_ready_prefix() -> None:
    snap = Snapshot(
        calls=(
            view("c0", 0, failed_var_id="x"),
            view("c1", 1, num_ready_pieces=3, num_filled_pieces=0),
            view("c2", 2, num_ready_pieces=3, num_filled_pieces=3, engine_id="e0"),  # nothing new to fill
            view("c3", 3, num_ready_pieces=5, num_filled_pieces=3, engine_id="e0"),  # extends on its engine
            view("c4", 4, num_ready_pieces=0),  # starts with a missing input
        ),
        engines=(engine("e0", early=1), engine("e1")),
    )
    plan = FifoPolicy().plan(snap)
    assert plan == Plan(
        fail=(FailCall(("s", "c0"), "x"),),
        early_fill=(EarlyFill(("s", "c1"), "e1", 3), EarlyFill(("s", "c3"), "e0", 5)),
    )


def test_early_fill_respects_capacity_and_the_switch() -> None:
    calls = (view("c0", 0, num_ready_pieces=1), view("c1", 1, num_ready_pieces=1), view("c2", 2, num_ready_pieces=1))
    engines = (engine("e0", early_cap=2),)
    assert FifoPolicy().plan(Snapshot(calls, engines)).early_fill == (
        EarlyFill(("s", "c0"), "e0", 1),
        EarlyFill(("s", "c1"), "e0", 1),
    )
    assert FifoPolicy().plan(Snapshot(calls, engines, early_fill=False)) == Plan()


def test_affinity_to_the_engine_holding_the_context_even_when_busier() -> None:
    snap = Snapshot(
        calls=(view("c0", 0, inputs_ready=True, engine_id="e0"),),
        engines=(engine("e0", running=1), engine("e1")),
    )
    assert FifoPolicy().plan(snap).dispatch == (Dispatch(("s", "c0"), "e0"),)
    full = Snapshot(snap.calls, (engine("e0", running=2), engine("e1")))
    assert FifoPolicy().plan(full) == Plan(blocked=(("s", "c0"),))


def test_calls_only_go_to_engines_of_their_model() -> None:
    snap = Snapshot(
        calls=(view("c0", 0, inputs_ready=True, model="big"), view("c1", 1, inputs_ready=True, model="none")),
        engines=(engine("e0"), engine("e1", model="big", running=1)),
    )
    assert FifoPolicy().plan(snap) == Plan(dispatch=(Dispatch(("s", "c0"), "e1"),), blocked=(("s", "c1"),))


def test_policy_registry() -> None:
    assert isinstance(make_policy("fifo"), FifoPolicy)
    with pytest.raises(ParrotError) as info:
        make_policy("nope")
    assert info.value.field == "policy"
