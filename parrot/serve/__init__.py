"""The manager: sessions, the session DAG, analysis, scheduling and dispatch to engines (no torch).

Entry points for a launcher:
    manager = create_manager(engines, tokenizer_folder=None, config=ManagerConfig())
    app = create_app(manager)      # FastAPI; its lifespan runs manager.start() / manager.stop()
"""

from parrot.serve.app import create_app
from parrot.serve.config import ManagerConfig
from parrot.serve.engine_client import EngineClient, HttpEngineClient
from parrot.serve.manager import Manager, create_manager

__all__ = ["EngineClient", "HttpEngineClient", "Manager", "ManagerConfig", "create_app", "create_manager"]
