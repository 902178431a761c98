"""Shared fixtures: the default model's folder (converted once) and a tiny random LLaMA."""

from __future__ import annotations

import os
from pathlib import Path

# Triton reads TRITON_INTERPRET when it is first imported; any test module may import it first,
# so it is set here, before all of them. CI has no GPU: the kernels run in the interpreter.
if not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder, write_tiny_model


@pytest.fixture(scope="session")
def default_model_folder() -> Path:
    return resolve_model_folder(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tokenizer_from=default_model_folder)
