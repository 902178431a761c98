from live_server import server, tiny_engine  # noqa: F401  (fixtures)
