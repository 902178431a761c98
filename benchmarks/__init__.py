"""Benchmarks: programs (not timed tests) that measure Parrot against its peers side by side."""

# Before any benchmark module loads torch: the builtin engine's OpenMP wait policy
# (parrot/engine/openmp.py) then holds in every benchmark process, as it does in `parrot serve`,
# and the vLLM peer is started with the same one (peers/vllm_server.py).
import parrot.engine  # noqa: F401
