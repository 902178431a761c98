"""The simulator: the real manager over simulated engines on a virtual clock (see README.md)."""
