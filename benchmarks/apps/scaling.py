"""How the application benchmark scales the paper's workloads down for a 2-core CPU.

The paper ran 7B/13B models on A100s with prompts of thousands of tokens and outputs of hundreds.
Here a 135M model runs on two shared CPU cores, so every workload keeps its *shape* (the DAG, the
sharing, the arrival process, the ratio of prompt to output) and shrinks its sizes:

- prompt-side lengths (chunks, system prompts, shared prefixes) are multiplied by `prompt_factor`
  and clamped to `max_prompt_tokens`;
- output lengths are multiplied by `output_factor` and clamped to `[min_output, max_output]`;
- counts (chunks, apps, files, requests) and rates come from the mode's own lists.

`QUICK` is what `make bench` runs (under 15 minutes); `FULL` sweeps more points. Both are stated
in results.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Scale:
    mode: str
    prompt_factor: float
    max_prompt_tokens: int
    output_factor: float
    min_output: int
    max_output: int
    # chain / map-reduce summary
    chunk_tokens: tuple[int, ...]  # swept (the first is the default point)
    output_tokens: tuple[int, ...]  # swept (the first is the default point)
    num_chunks: int
    num_map_chunks: int
    many_apps: tuple[int, ...]
    many_apps_chunks: int
    background_rates: tuple[float, ...]  # chain summary with background load; () skips it
    # GPTs serving
    gpts_rates: tuple[float, ...]
    gpts_requests_per_rate: int
    # multi-agent
    agent_files: tuple[int, ...]
    agent_rounds: tuple[int, ...]  # indices into the paper's rounds (0 = architect)
    # copilot
    copilot_prompt_tokens: int
    copilot_requests: int
    # chat mixed with map-reduce
    chat_requests: int
    chat_rate: float
    chat_max_prompt_tokens: int
    mixed_apps: int
    mixed_start_s: float
    mixed_gaps_s: tuple[float, ...]

    def prompt_len(self, paper_tokens: int) -> int:
        return max(1, min(self.max_prompt_tokens, round(paper_tokens * self.prompt_factor)))

    def output_len(self, paper_tokens: int) -> int:
        return max(self.min_output, min(self.max_output, round(paper_tokens * self.output_factor)))

    def describe(self) -> dict[str, Any]:
        return asdict(self)


QUICK = Scale(
    mode="quick",
    prompt_factor=1 / 8,
    max_prompt_tokens=1024,
    output_factor=1 / 16,
    min_output=25,
    max_output=32,
    chunk_tokens=(256,),
    output_tokens=(25,),
    num_chunks=4,
    num_map_chunks=8,
    many_apps=(4,),
    many_apps_chunks=3,
    background_rates=(),
    gpts_rates=(2.0, 4.0, 8.0),
    gpts_requests_per_rate=8,
    agent_files=(4,),
    agent_rounds=(0, 1, 2, 3),
    copilot_prompt_tokens=1024,
    copilot_requests=6,
    chat_requests=8,
    chat_rate=1.0,
    chat_max_prompt_tokens=256,
    mixed_apps=2,
    mixed_start_s=1.0,
    mixed_gaps_s=(2.0,),
)

FULL = Scale(
    mode="full",
    prompt_factor=1 / 4,
    max_prompt_tokens=2048,
    output_factor=1 / 8,
    min_output=25,
    max_output=100,
    chunk_tokens=(512, 256, 1024),
    output_tokens=(25, 50, 75, 100),
    num_chunks=8,
    num_map_chunks=16,
    many_apps=(4, 8, 12),
    many_apps_chunks=4,
    background_rates=(0.0, 0.5, 1.0),
    gpts_rates=(0.5, 1.0, 2.0, 4.0, 8.0),
    gpts_requests_per_rate=16,
    agent_files=(4, 8),
    agent_rounds=(0, 1, 2, 3, 2, 3),
    copilot_prompt_tokens=2048,
    copilot_requests=16,
    chat_requests=20,
    chat_rate=1.0,
    chat_max_prompt_tokens=512,
    mixed_apps=4,
    mixed_start_s=4.0,
    mixed_gaps_s=(0.5, 5.0, 0.5),
)

SCALES = {s.mode: s for s in (QUICK, FULL)}
