"""The builtin engine. Importing it sets libgomp's wait policy for the engine's OpenMP workers when
torch is not loaded yet and nobody chose one (openmp.py)."""

from parrot.engine.openmp import prefer_spinning

prefer_spinning()
