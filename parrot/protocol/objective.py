"""Performance objectives, two words for two things (DESIGN.md's glossary).

`Criteria` is what a client attaches to a `get`: a person awaits this value (latency), or the
batch should end soon (throughput). `Objective` is what the manager deduces for a call from the
criteria downstream of it, and what engines schedule by. They share their two values, but one is
a request and the other a decision, so they are distinct types; `Objective.of(criteria)` is the
one place a criteria becomes an objective.
"""

from __future__ import annotations

from enum import StrEnum


class Criteria(StrEnum):
    """The objective attached to a `get`: a person waits (latency) or a batch should end soon."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


class Objective(StrEnum):
    """A call's deduced performance objective; engines batch and cap by it."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"

    @classmethod
    def of(cls, criteria: Criteria) -> Objective:
        return cls(criteria.value)
