"""Benchmarks on the simulator (parrot.sim): the real manager over simulated engines, virtual time."""
