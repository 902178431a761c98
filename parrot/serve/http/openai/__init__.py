"""The OpenAI-compatible routes (routes.py), one request as a session of calls (call.py)."""

from parrot.serve.http.openai.routes import router

__all__ = ["router"]
