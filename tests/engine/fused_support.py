"""What the fused decoder layer tests share (test_fused_layer.py, bf16; test_fused_f32.py, float32):
a tiny model whose every piece the kernels take, and a counter of a kernel's calls."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from parrot.engine import kernels, sync_client
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.loader import write_tiny_model
from parrot.protocol import ExtendRequest, SamplingParams


def write_tiny32(tmp_path_factory: pytest.TempPathFactory, tokenizer_from: Path) -> Path:
    """A tiny model whose every piece the kernels take (head_dim 32), 3 layers, GQA 2:1."""
    path = tmp_path_factory.mktemp("models") / "tiny32"
    return write_tiny_model(path, tokenizer_from, seed=3, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32)


class Counted:
    """A kernel, counting its calls."""

    def __init__(self, fn: object) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        return self.fn(*args)  # type: ignore[operator]


def count_calls(monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL, name: str) -> Counted:
    """`lib.<name>` replaced, for the test, by a counter of its calls."""
    counter = Counted(getattr(lib, name))
    monkeypatch.setattr(lib, name, counter)
    return counter


def tokens_fused_or_not(engine: LLMEngine, counted: Counted) -> dict[bool, list[tuple[list[int], list[float]]]]:
    """Three seeded, sampled generations on `engine`, with its layers fused and then per op: each
    one's tokens and logprobs (the engine is started and stopped here); the fused ones must have
    called the counted kernel."""
    engine.start()
    try:
        results = {}
        for on in (True, False):
            kernels.set_fused(engine.model, on)
            sampling = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=7)
            events = []
            for i in range(3):
                cid = f"{on}-{i}"
                sync_client.extend_only(
                    engine, ExtendRequest(context_id=cid, token_ids=list(range(100 + i, 130 + 7 * i)))
                )
                events.append(sync_client.extend(engine, ExtendRequest(context_id=cid, append=True, sampling=sampling)))
            results[on] = [([e.token_id for e in ev], [e.logprob for e in ev]) for ev in events]
            if on:
                assert counted.calls > 0
    finally:
        engine.stop()
    return results
