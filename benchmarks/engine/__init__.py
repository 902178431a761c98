"""The engine benchmarks: the builtin engine's prefill and decode throughput against transformers
and vLLM (`python -m benchmarks.engine`), its native kernels against torch ops and other A/Bs of
one engine (`python -m benchmarks.engine.kernels`), the engine at two commits
(`python -m benchmarks.engine.commits`), and batch invariance on the real model
(`python -m benchmarks.engine.invariance`)."""
