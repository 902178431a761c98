"""Hugging Face transformers as a peer: `model.generate` on the same model folder, in process.

`HFPeer` loads the folder once in the given dtype (float32 or bfloat16), on 2 threads, and
measures with the same prompts and definitions as the other peers (`benchmarks.peers`):

- prefill: one prompt, `generate(max_new_tokens=1)`, prompt_len / wall time;
- decode: a left-padded batch, `generate(min_new_tokens=max_new_tokens=new_tokens)`, greedy;
  a streamer timestamps every step, and throughput counts the tokens after the first step
  (the prefill) over the time after it.

    python -m benchmarks.peers.hf_engine --dtype bfloat16 --batch-sizes 1 8 --new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from benchmarks.peers import WARM_UP_TOKENS, decode_seed, prefill_rates, prefill_seed, random_prompts

NUM_THREADS = 2
DECODE_PROMPT_LEN = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class StepClock(BaseStreamer):
    """Records when `generate` hands over each step's tokens; the first put is the prompt."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask, both [batch, max_len], prompts right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


class HFPeer:
    """Prefill and decode throughput of transformers' `generate` on one model folder."""

    def __init__(
        self, model_folder: Path, dtype: str = "bfloat16", repeats: int = 3, num_threads: int = NUM_THREADS
    ) -> None:
        torch.set_num_threads(num_threads)
        self.name = f"transformers-{dtype}"
        self.repeats = repeats
        model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=DTYPES[dtype])
        self.model = model.eval()
        self.vocab_size = int(self.model.config.vocab_size)
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad if pad is not None else self.model.config.eos_token_id)

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], new_tokens: int, clock: StepClock | None = None) -> torch.Tensor:
        ids, mask = left_pad(prompts, self.pad_id)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=self.pad_id,
            streamer=clock,
        )
        return out[:, ids.shape[1] :]

    def _time_to_one_token(self, prompt: list[int]) -> float:
        started = time.perf_counter()
        self._generate([prompt], 1)
        return time.perf_counter() - started

    def measure_prefill(self, lengths: list[int]) -> dict[int, float]:
        """Median over `repeats` distinct prompts of prompt_len / time to the single output token."""

        def seconds(prompt_len: int, r: int) -> float:
            prompt = random_prompts(1, prompt_len, self.vocab_size, prefill_seed(prompt_len, r))[0]
            return self._time_to_one_token(prompt)

        return prefill_rates(lengths, self.repeats, seconds)

    def measure_decode(self, batch_sizes: list[int], new_tokens: int) -> dict[int, float]:
        """Generated tokens/s of one batched `generate` per batch size, over the steps after prefill."""
        if new_tokens < 2:
            raise ValueError("new_tokens must be at least 2: the first token belongs to the prefill")
        results: dict[int, float] = {}
        for batch_size in batch_sizes:
            warm_up = random_prompts(batch_size, DECODE_PROMPT_LEN, self.vocab_size, decode_seed(batch_size, True))
            self._generate(warm_up, WARM_UP_TOKENS)
            prompts = random_prompts(batch_size, DECODE_PROMPT_LEN, self.vocab_size, decode_seed(batch_size))
            clock = StepClock()
            generated = self._generate(prompts, new_tokens, clock)
            if generated.shape != (batch_size, new_tokens):
                raise RuntimeError(f"generate returned {tuple(generated.shape)}, not {(batch_size, new_tokens)}")
            # times[0]: the prompt; times[1]: the first token (end of prefill); times[-1]: the last step.
            results[batch_size] = batch_size * (new_tokens - 1) / (clock.times[-1] - clock.times[1])
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure transformers' generate on a model folder.")
    parser.add_argument("--model-folder", type=Path, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 512, 2048])
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=NUM_THREADS)
    args = parser.parse_args()
    if args.model_folder is None:
        from benchmarks.peers.vllm_server import default_model_folder

        args.model_folder = default_model_folder()
    peer = HFPeer(args.model_folder, args.dtype, repeats=args.repeats, num_threads=args.threads)
    report = {
        "peer": peer.name,
        "prefill_tok_s": peer.measure_prefill(args.lengths),
        "decode_tok_s": peer.measure_decode(args.batch_sizes, args.new_tokens),
        "new_tokens": args.new_tokens,
    }
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
