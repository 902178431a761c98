import sys
from pathlib import Path

# The real-engine server fixtures and the fake engine live beside the manager's tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))

from live_server import server, tiny_engine  # noqa: F401  (fixtures)
