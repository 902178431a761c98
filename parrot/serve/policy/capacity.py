"""Engine capacity for latency-critical work, calibrated from the engine's own step profile.

An engine reports `step_ms_by_num_tokens` (EngineStats): recent step time by batched tokens per
step, in power-of-two buckets. While an engine serves latency-critical calls, every call it runs
adds about one token to each decode step, so the number of calls it may run is the number of
batched tokens whose step time stays under the time-per-output-token target. Throughput work
alone lifts that cap up to the engine's plain limit. Pure functions; the health monitor applies
`calibrate_latency_cap` to each heartbeat's stats and the scheduling policy reads the result.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping


def calibrate_latency_cap(
    profile: Mapping[int, float], tpot_target_ms: float, fallback: int, max_cap: int, floor_slack: float = 0.0
) -> int:
    """The most batched tokens per step whose step time stays at or under `tpot_target_ms`.

    With `floor_slack`, the target is at least that multiple of the engine's one- or two-token step
    time (a target the hardware cannot meet would otherwise cap latency work at one call).
    Linear between measured buckets; past the largest measured bucket, extrapolated along the last
    segment's slope. One bucket gives no slope: proportional extrapolation (a step costing nothing
    fixed) is only a lower bound, and `fallback`, the cap before anything is measured, holds until a
    second bucket is measured (a batching engine seen serving one stream at 20 ms a token would
    otherwise get a cap of 2 against a 50 ms target, and never run more streams to learn better).
    Always in [1, max_cap].
    """
    points = sorted((int(k), float(v)) for k, v in profile.items() if v > 0)
    if not points:
        return max(1, min(fallback, max_cap))
    if points[0][0] <= 2:  # a decode-sized step: the hardware's floor
        tpot_target_ms = max(tpot_target_ms, floor_slack * points[0][1])
    if points[0][1] > tpot_target_ms:
        return 1
    estimate: float = points[0][0]
    for (b0, m0), (b1, m1) in itertools.pairwise(points):
        if m1 <= tpot_target_ms:
            estimate = b1
            continue
        estimate = b0 + (tpot_target_ms - m0) * (b1 - b0) / (m1 - m0) if m1 > m0 else b0
        return _clamp(estimate, max_cap)
    b_last, m_last = points[-1]
    if len(points) >= 2 and m_last > points[-2][1]:
        slope = (m_last - points[-2][1]) / (b_last - points[-2][0])
        estimate = b_last + (tpot_target_ms - m_last) / slope
    else:
        estimate = b_last * tpot_target_ms / m_last
        if len(points) == 1:
            estimate = max(estimate, fallback)
    return _clamp(estimate, max_cap)


def _clamp(estimate: float, max_cap: int) -> int:
    return max(1, min(max_cap, math.floor(estimate)))


def call_capacity(num_latency_calls: int, latency_cap: int, max_running_calls: int, is_latency: bool) -> int:
    """How many calls an engine may run if it takes one more of this objective: the latency cap
    while it hosts (or would host) latency-critical work, its plain limit otherwise."""
    if num_latency_calls > 0 or is_latency:
        return min(latency_cap, max_running_calls)
    return max_running_calls
