"""Performance objectives: what a `get` asks for, and what the manager deduces for each call."""

from __future__ import annotations

from enum import StrEnum


class Criteria(StrEnum):
    """The objective attached to a `get`: a person waits (latency) or a batch should end soon."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


# A call's deduced objective uses the same two values; the alias keeps the glossary's words apart.
Objective = Criteria
