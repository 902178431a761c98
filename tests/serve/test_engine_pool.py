"""EnginePool: the engine a call of a model uses (for_model), and closing the clients it owns."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from parrot.serve.runtime.engines import EngineHandle, EnginePool


def pool_of(*engines: tuple[str, bool]) -> EnginePool:
    """A pool whose handles are (model, alive) pairs, registered in this order."""
    pool = EnginePool([cast(Any, object())])
    for i, (model, alive) in enumerate(engines):
        handle = EngineHandle(f"e{i}", cast(Any, None), model, 2048, cast(Any, None), cast(Any, None), alive=alive)
        pool.handles[handle.engine_id] = handle
    return pool


def test_for_model_takes_the_first_live_engine_of_the_model() -> None:
    pool = pool_of(("m", False), ("other", True), ("m", True), ("m", True))
    assert pool.for_model("m").engine_id == "e2"


def test_for_model_falls_back_to_the_first_engine_when_every_one_is_dead() -> None:
    pool = pool_of(("other", True), ("m", False), ("m", False))
    assert pool.for_model("m").engine_id == "e1"


def test_for_model_names_a_model_no_engine_serves() -> None:
    pool = pool_of(("m", True))
    with pytest.raises(KeyError, match="no engine serves model 'x'"):
        pool.for_model("x")


class Closable:
    def __init__(self) -> None:
        self.num_closed = 0

    async def aclose(self) -> None:
        self.num_closed += 1


def test_close_clients_closes_each_client_that_can_be_closed_once() -> None:
    """The manager owns the engine clients it was given: stopping it closes them (an in-process
    engine, without `aclose`, is skipped); closing chosen handles closes only theirs."""
    clients = [Closable(), object(), Closable()]
    pool = pool_of(("m", True), ("m", True), ("m", True))
    for handle, client in zip(pool.handles.values(), clients, strict=True):
        handle.client = cast(Any, client)
    asyncio.run(pool.close_clients([pool.handles["e2"]]))
    assert [cast(Closable, clients[0]).num_closed, cast(Closable, clients[2]).num_closed] == [0, 1]
    asyncio.run(pool.close_clients())
    assert [cast(Closable, clients[0]).num_closed, cast(Closable, clients[2]).num_closed] == [1, 2]
