"""Ordering policies: which jobs a step serves first. A registry maps config names to strategies.

A policy returns a sort key; smaller keys are served first and preempted last. A key ends with
the job's arrival and id; the priority fields before them (after the priority policy's leading
latency flag) are the job's *tier* (`tier`): the scheduler keeps a job's decode fast against the
prompts of jobs in lower tiers (EngineConfig.outranked_chunk_tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from parrot.protocol.objective import Objective


class Ranked(Protocol):
    """What a policy reads of a job (the builtin engine's `Job`, the simulator's `SimJob`)."""

    @property
    def job_id(self) -> int: ...

    @property
    def objective(self) -> Objective: ...

    @property
    def priority(self) -> int: ...

    @property
    def arrival(self) -> float: ...


OrderKey = Callable[[Ranked, float], tuple]


def fcfs(job: Ranked, now: float) -> tuple:
    return (job.arrival, job.job_id)


def make_priority(aging_s: float) -> OrderKey:
    """Latency-critical work first, then by priority, then by arrival.

    Aging: a job that has waited `aging_s` joins the front tier, so a stream of latency-critical
    or high-priority work never starves it.
    """

    def key(job: Ranked, now: float) -> tuple:
        front = job.objective == Objective.LATENCY or now - job.arrival >= aging_s
        return (0 if front else 1, -job.priority, job.arrival, job.job_id)

    return key


def tier(key: tuple) -> tuple:
    """The tier part of an order key: its priority, the fields between the first (the priority
    policy's latency-or-aged flag) and the last two (arrival, job id). Latency-critical and
    throughput work of one priority share a tier: the latency cap bounds their steps, and a
    throughput stage a person awaits (a map-reduce beside a chat) is batched, not starved; a
    higher priority (an awaited call over one nobody awaits, a tenant under its fair share) ranks
    above and keeps its decode fast against lower tiers' prompts."""
    return key[1:-2]


def get_policy(name: str, aging_s: float) -> OrderKey:
    policies: dict[str, Callable[[], OrderKey]] = {
        "fcfs": lambda: fcfs,
        "priority": lambda: make_priority(aging_s),
    }
    if name not in policies:
        raise ValueError(f"unknown scheduling policy {name!r}; known: {sorted(policies)}")
    return policies[name]()
