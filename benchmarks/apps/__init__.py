"""The application benchmark: the paper's applications on Parrot and on request-level baselines
(`python -m benchmarks.apps`; the runner is run.py, the applications are in workloads/)."""
