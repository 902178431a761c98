"""The app-centric policy on hand-built snapshots: exact plans."""

from __future__ import annotations

from parrot.protocol.objective import Objective
from parrot.serve.policy.app_centric import AppCentricPolicy
from parrot.serve.policy.plan import CallView, EarlyFill, EngineView, Plan, Snapshot
from parrot.serve.policy.registry import make_policy

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT


def ready(session: str, call_id: str, order: int, **kw: object) -> CallView:
    fields: dict[str, object] = {
        "key": (session, call_id),
        "model": "m",
        "order": order,
        "inputs_ready": True,
        "failed_var_id": None,
        "num_ready_pieces": 2,
        "num_filled_pieces": 0,
        "engine_id": None,
    }
    fields.update(kw)
    return CallView(**fields)  # type: ignore[arg-type]


def engine(engine_id: str, running: int = 0, latency: int = 0, cap: int = 4, max_running: int = 16, **kw: object):
    return EngineView(
        engine_id,
        kw.pop("model", "m"),  # type: ignore[arg-type]
        running,
        max_running,
        kw.pop("early", 0),  # type: ignore[arg-type]
        kw.pop("early_cap", 4),  # type: ignore[arg-type]
        num_latency_calls=latency,
        latency_cap=cap,
        **kw,  # type: ignore[arg-type]
    )


def plan(calls: list[CallView], engines: list[EngineView], **kw: object) -> Plan:
    return AppCentricPolicy().plan(Snapshot(tuple(calls), tuple(engines), **kw))  # type: ignore[arg-type]


def placed(p: Plan) -> dict[str, str]:
    return {d.key[1]: d.engine_id for d in p.dispatch}


def test_registered_by_name() -> None:
    assert isinstance(make_policy("app_centric"), AppCentricPolicy)


def test_calls_go_to_the_engine_holding_their_longest_prefix_while_capacity_allows() -> None:
    engines = [engine(f"e{i}", cap=2) for i in range(4)]
    calls = [
        ready(f"app{a}", f"c{j}", order=10 * j + a, prefix_hits=((f"e{a}", 500), ("e0", 8) if a else ("e1", 8)))
        for a in range(4)
        for j in range(3)
    ]
    p = plan(calls, engines)
    # Two latency calls per engine (the cap): each app's first two on its own engine; the third
    # would spill to another engine, but none has room, so they wait.
    got = sorted((d.key[0], d.key[1], d.engine_id) for d in p.dispatch)
    assert got == sorted((f"app{a}", f"c{j}", f"e{a}") for a in range(4) for j in range(2))
    assert sorted(p.blocked) == sorted((f"app{a}", "c2") for a in range(4))


def test_latency_calls_never_exceed_the_cap_but_throughput_lifts_it() -> None:
    engines = [engine("e0", running=3, latency=3, cap=4, max_running=6), engine("e1", running=5, cap=4, max_running=6)]
    calls = [
        ready("s", "l0", 0, objective=LAT),
        ready("s", "l1", 1, objective=LAT),
        ready("s", "l2", 2, objective=LAT),
        ready("s", "t0", 3, objective=TPUT),
        ready("s", "t1", 4, objective=TPUT),
    ]
    p = plan(calls, engines)
    # e0 hosts latency work: one more latency call reaches its cap of 4. e1 runs throughput work
    # only (5 of 6), placed while it hosted no latency work: those do not hold a latency call
    # back (l1 takes its last slot); once it hosts one, no throughput call starts past the cap.
    assert placed(p) == {"l0": "e0", "l1": "e1"}
    assert p.blocked == (("s", "l2"), ("s", "t0"), ("s", "t1"))


def test_throughput_calls_running_never_hold_a_latency_call_back() -> None:
    """A latency call on an engine full of throughput work (past the latency cap, under its plain
    limit) is dispatched; the throughput call behind it waits until the engine is under the cap."""
    p = plan([ready("s", "t", 0, objective=TPUT), ready("s", "l", 1, objective=LAT)], [engine("e0", 10, cap=4)])
    assert [placed(p), p.blocked] == [{"l": "e0"}, (("s", "t"),)]


def test_a_call_that_fits_nowhere_reserves_the_engine_that_frees_first() -> None:
    engines = [engine("e0", running=4, latency=1, cap=4, max_running=8), engine("e1", running=5, latency=2, cap=4)]
    old = ready("s", "old_bulk", 0, objective=TPUT, ready_since=0.0)
    calls = [old, ready("s", "lat", 1, objective=LAT, ready_since=9.0)]
    p = plan(calls, engines, now=10.0, aging_s=5.0)
    # The aged throughput call ranks first and fits nowhere (both engines host latency work, at
    # their cap of 4 calls): it reserves e0, which frees first; `lat`, which would fit on the less
    # loaded e0, takes e1 instead.
    assert [placed(p), p.blocked] == [{"lat": "e1"}, (("s", "old_bulk"),)]


def test_a_task_group_is_placed_together_when_it_fits() -> None:
    engines = [engine("e0", running=1, cap=8), engine("e1", running=0, cap=8, max_running=3)]
    group = [ready("s", f"m{i}", i, objective=TPUT, task_group="s/r") for i in range(4)]
    p = plan(group, engines)
    # All four fit on e0 only (e1 takes 3): together there, although e1 is less loaded.
    assert placed(p) == {f"m{i}": "e0" for i in range(4)}
    # When the group fits nowhere whole, a member goes alone (least loaded, then where its group
    # runs) and the rest is tried together again: m2 and m3 fit on e0 together.
    engines = [engine("e0", running=14, max_running=16), engine("e1", running=13, max_running=16)]
    p = plan(group, engines)
    assert placed(p) == {"m0": "e1", "m1": "e1", "m2": "e0", "m3": "e0"}


def test_group_and_app_affinity_follow_running_work() -> None:
    engines = [engine("e0", running=2), engine("e1", running=0), engine("e2", running=1)]
    calls = [
        ready("s", "late_map", 0, objective=TPUT, task_group="s/r"),
        ready("s", "other", 1, objective=TPUT),
        ready("t", "fresh", 2, objective=TPUT),
    ]
    p = plan(calls, engines, group_engines={"s/r": ("e2",)}, app_engines={"s": ("e0",)})
    assert placed(p) == {"late_map": "e2", "other": "e0", "fresh": "e1"}


def test_rank_latency_then_priority_then_cache_hot_then_order_and_aging_first() -> None:
    engines = [engine("e0", max_running=1, cap=1)]
    calls = [
        ready("s", "old_cold", 0, objective=TPUT, ready_since=0.0),
        ready("s", "hot", 1, objective=TPUT, prefix_hits=(("e0", 100),), ready_since=9.0),
        ready("s", "urgent_group", 2, objective=TPUT, priority=1, ready_since=9.0),
        ready("s", "lat", 3, objective=LAT, ready_since=9.0),
    ]
    ranked = []
    remaining = list(calls)
    while remaining:
        p = plan(remaining, engines, now=10.0, aging_s=0.0)
        (d,) = p.dispatch
        ranked.append(d.key[1])
        remaining = [c for c in remaining if c.key != d.key]
    assert ranked == ["lat", "urgent_group", "hot", "old_cold"]
    # With aging, the call waiting 10 s (>= aging_s) goes first, before latency work.
    p = plan(calls, engines, now=10.0, aging_s=5.0)
    assert placed(p) == {"old_cold": "e0"}


def test_pinned_calls_run_where_their_context_is_and_dead_engines_get_nothing() -> None:
    engines = [engine("e0", running=16), engine("e1", alive=False), engine("e2")]
    calls = [
        ready("s", "pinned", 0, engine_id="e0", pinned=True),
        ready("s", "preferred", 1, engine_id="e1"),
        ready("s", "other_model", 2, model="x"),
    ]
    p = plan(calls, engines)
    assert placed(p) == {"preferred": "e2"}
    assert p.blocked == (("s", "pinned"), ("s", "other_model"))


def test_early_fills_go_where_the_call_will_run() -> None:
    engines = [engine("e0", early=0), engine("e1", early=2), engine("e2", early=4)]
    waiting = [
        ready("s", "hot", 0, inputs_ready=False, num_ready_pieces=2, prefix_hits=(("e1", 64),)),
        ready("s", "done", 1, inputs_ready=False, num_ready_pieces=2, num_filled_pieces=2),
        ready("s", "placed", 2, inputs_ready=False, num_ready_pieces=3, num_filled_pieces=2, engine_id="e2"),
        ready("t", "cold", 3, inputs_ready=False, num_ready_pieces=1),
        ready("s", "full", 4, inputs_ready=False, num_ready_pieces=1, prefix_hits=(("e2", 64),)),
    ]
    p = plan(waiting, engines)
    assert p.early_fill == (
        EarlyFill(("s", "hot"), "e1", 2),
        EarlyFill(("s", "placed"), "e2", 3),
        EarlyFill(("t", "cold"), "e0", 1),
        EarlyFill(("s", "full"), "e1", 1),  # e2 has no early room; e1 hosts the app already
    )
    assert p.dispatch == ()
    assert plan(waiting, engines, early_fill=False).early_fill == ()


def test_early_fills_without_affinity_spread_by_fewest_early_fills_until_every_engine_is_full() -> None:
    engines = [
        engine("e0", early=1, early_cap=2),
        engine("e1", early_cap=2),
        engine("e2", early_cap=2),
        engine("dead", alive=False),
        engine("other", model="x"),
    ]
    cold = [ready(f"app{i}", "c", i, inputs_ready=False, num_ready_pieces=1) for i in range(6)]
    stranded = ready("z", "pinned", 9, inputs_ready=False, num_ready_pieces=1, engine_id="dead", pinned=True)
    p = plan([*cold, stranded], engines)
    # e1, e2 (0 each, by id), then e0, e1, e2 at 1 each; e0 is then full and so is every other.
    assert [(f.key[0], f.engine_id) for f in p.early_fill] == [
        ("app0", "e1"),
        ("app1", "e2"),
        ("app2", "e0"),
        ("app3", "e1"),
        ("app4", "e2"),
    ]


def test_a_tenant_under_its_share_is_not_kept_behind_another_tenants_flood() -> None:
    # Tenant a fills e0 (4 of 4 running, throughput); b's one call, submitted last, still runs now
    # (a little room over the cap for a tenant under its share) and a's waiting calls stay blocked.
    flood = [ready("sa", f"a{i}", order=i, objective=TPUT, tenant="a") for i in range(3)]
    late = ready("sb", "b0", order=10, objective=TPUT, tenant="b")
    full = engine("e0", running=4, max_running=4)
    p = plan([*flood, late], [full], tenant_running={"e0": {"a": 4}})
    assert [placed(p), list(p.blocked)] == [{"b0": "e0"}, [("sa", "a0"), ("sa", "a1"), ("sa", "a2")]]
    # One tenant alone: exactly the cap, as before.
    p = plan([*flood, ready("sa", "a9", order=9, objective=TPUT, tenant="a")], [full], tenant_running={"e0": {"a": 4}})
    assert placed(p) == {}


def test_the_tenant_with_fewer_running_calls_goes_first() -> None:
    # Room for one call: b (nothing running) before a (two running), though a's call is older.
    calls = [
        ready("sa", "a0", order=1, objective=TPUT, tenant="a"),
        ready("sb", "b0", order=2, objective=TPUT, tenant="b"),
    ]
    p = plan(calls, [engine("e0", running=3, max_running=4)], tenant_running={"e0": {"a": 2, "c": 1}})
    assert [placed(p), list(p.blocked)] == [{"b0": "e0"}, [("sa", "a0")]]


def test_a_tenant_with_nothing_running_gets_a_call_past_a_flood_over_a_calibrated_down_cap() -> None:
    # a's 16 calls were dispatched before the latency cap was calibrated down to 1: the engine is far
    # over its cap, but b (nothing there) may still run its share (one call), marked fair_share.
    flood = ready("sa", "a16", order=16, tenant="a")
    late = ready("sb", "b0", order=20, tenant="b")
    over = engine("e0", running=16, latency=16, cap=1, max_running=16)
    p = plan([flood, late], [over], tenant_running={"e0": {"a": 16}})
    assert [placed(p), [d.fair_share for d in p.dispatch], list(p.blocked)] == [{"b0": "e0"}, [True], [("sa", "a16")]]


def test_another_tenants_aged_calls_do_not_rank_ahead_of_a_tenant_with_less_running() -> None:
    # a's call waited past aging_s; b has nothing running: b goes first (aging orders within a share).
    aged = ready("sa", "a0", order=1, tenant="a", ready_since=0.0)
    fresh = ready("sb", "b0", order=2, tenant="b", ready_since=99.0)
    p = plan(
        [aged, fresh], [engine("e0", running=3, max_running=4)], now=100.0, aging_s=5.0, tenant_running={"e0": {"a": 3}}
    )
    assert [placed(p), list(p.blocked)] == [{"b0": "e0"}, [("sa", "a0")]]


def test_fair_share_marks_only_a_tenant_under_its_share_beside_one_over_it() -> None:
    alone = plan([ready("sa", "a0", order=1, tenant="a")], [engine("e0")])
    # b runs 1 call of a share of 2 (latency cap 4, two tenants): a passing overlap, nobody is marked.
    overlap = plan([ready("sa", "a0", order=1, tenant="a")], [engine("e0", running=1)], tenant_running={"e0": {"b": 1}})
    # b runs 9: a is under its share beside a tenant over its own.
    crowded = plan([ready("sa", "a0", order=1, tenant="a")], [engine("e0", running=9)], tenant_running={"e0": {"b": 9}})
    assert [[d.fair_share for d in p.dispatch] for p in (alone, overlap, crowded)] == [[False], [False], [True]]


def test_a_prefix_every_engine_holds_ranks_hot_and_places_as_the_full_map_would() -> None:
    # The view lists only engines holding more than the floor (what every engine holds).
    engines = [engine("e0", running=2), engine("e1", running=1), engine("e2", running=3)]
    floor_only = ready("s", "a", 0, prefix_floor=256, objective=TPUT)
    full_map = ready("s", "a", 0, prefix_hits=(("e0", 256), ("e1", 256), ("e2", 256)), objective=TPUT)
    assert placed(plan([floor_only], engines)) == placed(plan([full_map], engines)) == {"a": "e1"}
    deeper = ready("s", "a", 0, prefix_hits=(("e2", 300),), prefix_floor=256, objective=TPUT)
    assert placed(plan([deeper], engines)) == {"a": "e2"}
    # Cache-hot ranking counts the floor: a call with it goes before a colder, earlier one.
    one = [engine("e0", max_running=1, cap=1)]
    cold = ready("s", "cold", 0, objective=TPUT)
    hot = ready("s", "hot", 1, prefix_floor=256, objective=TPUT)
    assert placed(plan([cold, hot], one)) == {"hot": "e0"}
