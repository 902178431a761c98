"""Parrot: serving LLM-based applications with Semantic Variables.

Layers (imports go one way, bottom first):
    protocol  -- typed messages of the public API and the engine API; imports nothing of parrot.
    text      -- tokenizer and chat template (no torch); used by the manager and the engine.
    frontend  -- the client SDK; imports protocol only.
    serve     -- the manager; imports protocol and text only.
    engine    -- engine runtime and backends; imports protocol and text, never serve.
"""

__version__ = "0.1.0"
