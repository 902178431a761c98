"""The manager: sessions, the session DAG, analysis, scheduling and dispatch to engines (no torch).

Entry points for a launcher (parrot/launch.py is the one that wires engines in):
    manager = create_manager(engines, tokenizer_folder=None, config=ManagerConfig())
    app = create_app(manager, connect_engine=...)  # FastAPI; its lifespan runs manager.start() / stop()
"""

from parrot.serve.config import ManagerConfig
from parrot.serve.http.app import create_app
from parrot.serve.manager import Manager, create_manager

__all__ = ["Manager", "ManagerConfig", "create_app", "create_manager"]
