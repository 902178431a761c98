"""The benchmarks' network model (benchmarks/common/netsim.py): seeded round trips from the paper's
samples, one stream per independent client, half paid each way."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.common import netsim
from benchmarks.common.netsim import RoundTrip, RttModel
from benchmarks.common.paper import load_paper_workloads

PAPER = load_paper_workloads()


# ---- the network model --------------------------------------------------------------------------


def test_rtt_draws_are_seeded_per_stream_and_come_from_the_samples() -> None:
    model = RttModel.from_workloads(PAPER)
    assert len(model.samples_ms) == 100 and model.samples_ms[0] == 248.365
    a, b, other = model.sampler("rtt/x"), model.sampler("rtt/x"), model.sampler("rtt/y")
    draws = a.draws(50)
    assert draws == b.draws(50)
    assert draws != other.draws(50)
    assert {round(d * 1000, 3) for d in draws} <= set(model.samples_ms)
    assert a.num_round_trips == 50 and a.total_s == pytest.approx(sum(draws))


def test_an_independent_clients_stream_draws_the_same_whatever_the_others_draw() -> None:
    model = RttModel.from_workloads(PAPER)
    # A request-level configuration: the app draws a round trip per call (5) before chat 1 draws;
    # a Parrot one: one per submission. On one shared stream chat 1 would get different draws.
    request_level, parrot = model.sampler("rtt/m"), model.sampler("rtt/m")
    chats_rl = [request_level.stream("chat/0").draw_s()]
    request_level.stream("app/0").draws(5)
    chats_rl.append(request_level.stream("chat/1").draw_s())
    chats_p = [parrot.stream("chat/0").draw_s()]
    parrot.stream("app/0").draws(1)
    chats_p.append(parrot.stream("chat/1").draw_s())
    assert chats_rl == chats_p
    assert (request_level.num_round_trips, parrot.num_round_trips) == (7, 3)  # counted by the run's sampler
    assert parrot.stream("chat/1") is parrot.stream("chat/1")  # one stream a key: its draws go on
    assert parrot.total_s == pytest.approx(sum(chats_p) + model.sampler("rtt/m/app/0").draw_s())


def test_rtt_scale_and_validation() -> None:
    assert RttModel((100.0, 300.0), scale=0.5).mean_ms == 100.0
    assert RttModel((250.0,), scale=0.0).sampler("s").draws(3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="at least one"):
        RttModel(())
    with pytest.raises(ValueError, match=">= 0"):
        RttModel((1.0,), scale=-1.0)


def test_a_request_pays_half_a_round_trip_each_way(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = RttModel((80.0,)).sampler("s")
    log: list[object] = []

    async def sleep(seconds: float) -> None:  # recorded, not slept: exact on a loaded machine
        log.append(seconds)

    async def call() -> str:
        log.append("call")
        return "done"

    monkeypatch.setattr(netsim, "_sleep", sleep)
    assert asyncio.run(sampler.around(call())) == "done"
    assert log == [0.04, "call", 0.04]
    trip = RoundTrip(sampler)  # one draw for a whole submission, paid in two halves
    asyncio.run(trip.out())
    asyncio.run(trip.back())
    assert log[3:] == [0.04, 0.04] and sampler.num_round_trips == 2
