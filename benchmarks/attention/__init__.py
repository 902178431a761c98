"""Attention kernels alone: shared-prefix decode attention against per-context
(`python -m benchmarks.attention.shared_prefix`), prefill attention's chunk kernel against per-row
and SDPA (`python -m benchmarks.attention.prefill`), and the Triton kernels on a CUDA GPU
(`python -m benchmarks.attention.gpu`)."""
