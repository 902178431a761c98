"""The executor's index of where running calls are: exact maps as runs take and give back slots."""

from __future__ import annotations

from parrot.serve.runtime.placements import Placements


def test_placements_track_groups_apps_and_tenants_exactly() -> None:
    placed = Placements()
    placed.add(1, "s1", "g", "e1", "t")
    placed.add(2, "s1", "g", "e0", "t")
    placed.add(3, "s1", None, "e1", "u")
    placed.add(4, "s2", None, "e1", "t")
    assert dict(placed.group_engines) == {"s1/g": ("e0", "e1")}
    assert dict(placed.app_engines) == {"s1": ("e0", "e1"), "s2": ("e1",)}
    assert placed.tenant_running == {"e1": {"t": 2, "u": 1}, "e0": {"t": 1}}
    placed.remove(2)
    placed.remove(4)
    placed.remove(4)  # twice: nothing more happens
    assert [dict(placed.group_engines), dict(placed.app_engines)] == [{"s1/g": ("e1",)}, {"s1": ("e1",)}]
    assert placed.tenant_running == {"e1": {"t": 1, "u": 1}}
    placed.add(1, "s3", None, "e2", "t")  # a run placed again moves
    assert [dict(placed.group_engines), dict(placed.app_engines)] == [{}, {"s1": ("e1",), "s3": ("e2",)}]
    assert placed.tenant_running == {"e1": {"u": 1}, "e2": {"t": 1}}
