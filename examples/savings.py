"""What the demo measured: the manager's counters over each run of the apps, and the closing summary.

A `Phase` is one run of the apps (through Parrot sessions, or the same calls as plain requests):
the difference of the manager's cumulative counters (`GET /v1/status`) before and after it, and its
wall time. Every figure of the summary is one of these, or a ratio of two.
"""

from __future__ import annotations

from dataclasses import dataclass

from parrot.protocol.ops_api import ClusterStatus


@dataclass(frozen=True)
class Phase:
    num_calls: int  # calls the manager finished (a plain request is one call)
    num_prompt_tokens: int
    num_reused_tokens: int  # prompt tokens whose KV came from prefixes other calls computed
    num_generated_tokens: int
    num_gets: int  # variable gets and streams: the client round trips a session paid
    seconds: float

    @classmethod
    def between(cls, before: ClusterStatus, after: ClusterStatus, seconds: float) -> Phase:
        return cls(
            num_calls=after.num_calls_finished - before.num_calls_finished,
            num_prompt_tokens=after.num_prompt_tokens - before.num_prompt_tokens,
            num_reused_tokens=after.num_reused_tokens - before.num_reused_tokens,
            num_generated_tokens=after.num_generated_tokens - before.num_generated_tokens,
            num_gets=after.num_variable_gets - before.num_variable_gets,
            seconds=seconds,
        )

    @property
    def num_round_trips_avoided(self) -> int:
        """A request-level client pays one round trip per call; a session, one per get."""
        return max(self.num_calls - self.num_gets, 0)


def summary_lines(parrot: Phase, request_level: Phase, num_same: int, num_apps: int) -> list[str]:
    """The closing summary: what Parrot saved in this run, against the same apps sent one request
    at a time to the same manager and engine. `num_same`: apps whose final text was the same."""
    share = parrot.num_reused_tokens / parrot.num_prompt_tokens if parrot.num_prompt_tokens else 0.0
    speedup = request_level.seconds / parrot.seconds if parrot.seconds else 0.0
    return [
        "What Parrot saved in this run (the manager's counters, GET /v1/status):",
        f"  prompt tokens reused from shared prefixes: {parrot.num_reused_tokens:,} of "
        f"{parrot.num_prompt_tokens:,} ({share:.0%}), computed once and forked",
        f"  client round trips avoided: {parrot.num_round_trips_avoided} ({parrot.num_gets} variable gets "
        f"for {parrot.num_calls} calls; intermediate values never left the manager)",
        f"  time: {parrot.seconds:.1f} s for the {num_apps} apps; the same {request_level.num_calls} calls sent "
        f"one request at a time (POST /v1/chat/completions, each awaited): {request_level.seconds:.1f} s "
        f"({speedup:.2f}x)",
        f"  the request-level run reused {request_level.num_reused_tokens:,} of {request_level.num_prompt_tokens:,} "
        "prompt tokens through the same prefix cache (chat-message and token-block boundaries)",
        f"  same final text in both runs: {num_same} of {num_apps} apps (greedy)",
    ]
