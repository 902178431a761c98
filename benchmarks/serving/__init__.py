"""Server-level probes: the manager under load and its path to an engine (tenant_flood, load_probe,
manager_path, vllm_paths), and the cost or quality of OpenAI-API features on the builtin engine
(openai_n, constrained_step, json_schema_validity, select_scoring, grammar_engines). Each is
`python -m benchmarks.serving.<name>`; each prints its figures (manager_path also writes a result
set)."""
