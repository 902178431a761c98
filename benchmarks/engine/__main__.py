"""`python -m benchmarks.engine [--quick] [--no-vllm] ...`: see benchmarks/engine/throughput.py."""

from benchmarks.engine.throughput import main

main()
