"""Benchmarks: programs (not timed tests) that measure Parrot against its peers side by side."""
