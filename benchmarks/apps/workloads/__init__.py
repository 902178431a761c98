"""The paper's applications, each written once with the Parrot SDK and once as a request-level
client (see common.py for the contract every module follows)."""

from __future__ import annotations

from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads import chain_summary, copilot, gpts, map_reduce, mixed, multi_agent
from benchmarks.apps.workloads.common import Scenario

APPS = (chain_summary, map_reduce, gpts, multi_agent, copilot, mixed)


def all_scenarios(scale: Scale, paper: dict, only: set[str] | None = None) -> list[Scenario]:
    """Every application's scenarios at `scale`, in a fixed order; `only` keeps those workloads."""
    return [s for app in APPS if only is None or app.NAME in only for s in app.scenarios(scale, paper)]
