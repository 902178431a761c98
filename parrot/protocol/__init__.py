"""Typed messages shared by every layer: sampling settings, objectives, engine API, public API.

This package is the bottom layer: it imports pydantic and the standard library, nothing of parrot.
"""

from parrot.protocol.engine_api import (
    ContextInfo,
    EngineStats,
    ExtendRequest,
    Filled,
    FreeContextRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria, Objective
from parrot.protocol.sampling import SamplingParams

__all__ = [
    "ContextInfo",
    "Criteria",
    "EngineStats",
    "ExtendRequest",
    "Filled",
    "FreeContextRequest",
    "Objective",
    "ParrotError",
    "SamplingParams",
    "TokenEvent",
]
