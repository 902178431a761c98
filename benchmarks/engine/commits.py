"""The builtin engine at two commits, A/B: prompt-to-first-token and decode-step times of this
working tree against a base revision, each measured in its own process, the two trees alternated
round by round (the machine is shared and noisy: only interleaved ratios travel).

    python -m benchmarks.engine.commits BASE [p128 p512 p2048 d1 d8 d32 d64] [--rounds 3] [--prompt-len 400]

BASE is any git revision; it is checked out into a temporary worktree (removed at the end) and run
with this checkout's virtual environment. pN: a prompt of N tokens to its first token (the median
of 3 prompts, 2 at N >= 2048); dN: the mean decode step with N sequences of `--prompt-len` tokens
(the engine loop stopped, steps run in the probe's thread), as `benchmarks.engine.kernels` times
them: each tree's own `StepTimer` (benchmarks/engine/step_timer.py; a revision without it must have
benchmarks/kernel_ab.py). Prints, per case, both medians and base / this (above 1: this tree is
faster), with every round's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
DEFAULT_CASES = ["p128", "p512", "p2048", "d1", "d8", "d32", "d64"]


def probe(cases: list[str], seed: int, prompt_len: int) -> None:
    """In the tree on PYTHONPATH: one engine (default config), each case once; one JSON line."""
    import torch

    import parrot

    try:
        from benchmarks.engine.step_timer import StepTimer
    except ModuleNotFoundError:  # a revision that keeps it beside the kernel A/B
        from benchmarks.kernel_ab import StepTimer  # type: ignore[import-not-found, no-redef]
    from parrot.engine.config import EngineConfig
    from parrot.engine.llm_engine import LLMEngine
    from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder

    torch.set_num_threads(2)
    engine = LLMEngine(EngineConfig(model=str(resolve_model_folder(DEFAULT_MODEL)), max_num_batched_tokens=4096))
    engine.start()
    try:
        timer = StepTimer(engine, seed=seed)
        timer.prefill_ms(64)  # warm: packs weights, sizes buffers
        out: dict[str, float] = {}
        for case in cases:
            n = int(case[1:])
            if case[0] == "p":
                out[case] = statistics.median(timer.prefill_ms(n) for _ in range(2 if n >= 2048 else 3))
            else:
                out[case] = timer.decode_ms(n, steps=10, prompt_len=prompt_len)
    finally:
        engine.stop()
    print(json.dumps({"parrot": str(Path(parrot.__file__).resolve()), "ms": out}))


def run_probe(tree: Path, cases: list[str], seed: int, prompt_len: int) -> dict[str, float]:
    cmd = [sys.executable, str(HERE), "--probe", "--seed", str(seed), "--prompt-len", str(prompt_len), *cases]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"probe in {tree} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(result["parrot"]).is_relative_to(tree.resolve()):
        raise SystemExit(f"the probe in {tree} imported parrot from {result['parrot']}")
    return result["ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", nargs="?", help="the git revision to compare against")
    ap.add_argument("cases", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=400, help="tokens of each decoding sequence")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe:  # argparse put the first case in `base`
        probe([a.base, *a.cases] if a.base else a.cases, a.seed, a.prompt_len)
        return
    if a.base is None:
        raise SystemExit("name a base revision (e.g. HEAD~1)")
    bad = [c for c in a.cases if c[:1] not in ("p", "d") or not c[1:].isdigit()]
    if bad:
        raise SystemExit(f"cases are pN or dN, not {bad}")
    rev = subprocess.run(["git", "rev-parse", "--short", a.base], cwd=ROOT, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), a.base], cwd=ROOT, check=True)
        try:
            trees = {"base": base_tree, "this": ROOT}
            times: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for r in range(a.rounds):
                for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                    times[name].append(run_probe(trees[name], a.cases, r, a.prompt_len))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
    print(f"base {rev.stdout.strip()} vs this tree: medians of {a.rounds} interleaved rounds (ms)")
    for case in a.cases:
        base = statistics.median(t[case] for t in times["base"])
        this = statistics.median(t[case] for t in times["this"])
        rounds = ", ".join(f"{b[case] / t[case]:.2f}" for b, t in zip(times["base"], times["this"], strict=True))
        print(f"{case}: base {base:.1f}, this {this:.1f}, base / this {base / this:.2f}x (rounds: {rounds})")


if __name__ == "__main__":
    main()
