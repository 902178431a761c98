"""Scheduling policies by name (`ManagerConfig.scheduling.policy`, `parrot serve --policy`)."""

from __future__ import annotations

from collections.abc import Callable

from parrot.protocol.errors import ParrotError
from parrot.serve.policy.app_centric import AppCentricPolicy
from parrot.serve.policy.fifo import FifoPolicy
from parrot.serve.policy.plan import Policy

POLICIES: dict[str, Callable[[], Policy]] = {"fifo": FifoPolicy, "app_centric": AppCentricPolicy}


def make_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ParrotError(f"unknown scheduling policy {name!r}; known: {sorted(POLICIES)}", field="policy")
    return POLICIES[name]()
