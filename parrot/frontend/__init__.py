"""The client SDK: write LLM applications with Semantic Variables (imports parrot.protocol only).

from parrot.frontend import Session, semantic_function, native_function, Input, Output, select
from parrot.frontend import system, user, assistant    # chat-form functions (chat.py)
"""

from parrot.frontend.chat import ChatMessage, assistant, system, user
from parrot.frontend.function import SemanticFunction, semantic_function
from parrot.frontend.inputs import Input
from parrot.frontend.native import NativeFunction, native_function
from parrot.frontend.outputs import Output, select
from parrot.frontend.session import AsyncSession, Session
from parrot.frontend.transport import end_of_loop
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.sampling import SamplingParams

__all__ = [
    "AsyncSession",
    "ChatMessage",
    "Criteria",
    "Input",
    "NativeFunction",
    "Output",
    "ParrotError",
    "SamplingParams",
    "SemanticFunction",
    "SemanticVariable",
    "Session",
    "assistant",
    "end_of_loop",
    "native_function",
    "select",
    "semantic_function",
    "system",
    "user",
]
