"""Latency-cap calibration from an engine's step profile: exact caps."""

from __future__ import annotations

from parrot.serve.policy.capacity import calibrate_latency_cap, call_capacity


def test_calibration_from_the_step_profile() -> None:
    profile = {1: 10.0, 2: 11.0, 4: 12.0, 8: 14.0, 16: 20.0, 32: 40.0, 64: 90.0}
    # Interpolated between the buckets around the target.
    assert calibrate_latency_cap(profile, tpot_target_ms=30.0, fallback=4, max_cap=64) == 24
    assert calibrate_latency_cap(profile, tpot_target_ms=20.0, fallback=4, max_cap=64) == 16
    assert calibrate_latency_cap(profile, tpot_target_ms=65.0, fallback=4, max_cap=64) == 48
    # Even one token per step misses the target: one call at a time.
    assert calibrate_latency_cap(profile, tpot_target_ms=5.0, fallback=4, max_cap=64) == 1
    # Past the largest bucket: extrapolated along the last slope, within max_cap.
    assert calibrate_latency_cap({8: 10.0, 16: 12.0}, tpot_target_ms=20.0, fallback=4, max_cap=1000) == 48
    assert calibrate_latency_cap({8: 10.0, 16: 12.0}, tpot_target_ms=20.0, fallback=4, max_cap=32) == 32
    assert calibrate_latency_cap({16: 10.0}, tpot_target_ms=20.0, fallback=4, max_cap=1000) == 32
    # One bucket gives no slope: the cap before any measurement holds until a second bucket does.
    assert calibrate_latency_cap({1: 20.0}, tpot_target_ms=50.0, fallback=16, max_cap=1000) == 16
    assert calibrate_latency_cap({1: 20.0, 2: 21.0}, tpot_target_ms=50.0, fallback=16, max_cap=1000) == 31
    # Nothing measured yet.
    assert calibrate_latency_cap({}, tpot_target_ms=20.0, fallback=4, max_cap=1000) == 4
    assert calibrate_latency_cap({}, tpot_target_ms=20.0, fallback=4, max_cap=2) == 2


def test_latency_work_caps_an_engine_and_throughput_lifts_the_cap() -> None:
    assert call_capacity(num_latency_calls=0, latency_cap=8, max_running_calls=64, is_latency=False) == 64
    assert call_capacity(num_latency_calls=0, latency_cap=8, max_running_calls=64, is_latency=True) == 8
    assert call_capacity(num_latency_calls=3, latency_cap=8, max_running_calls=64, is_latency=False) == 8
    assert call_capacity(num_latency_calls=3, latency_cap=128, max_running_calls=64, is_latency=True) == 64


def test_a_target_below_the_hardware_floor_is_lifted_by_the_slack() -> None:
    # A CPU engine: a one-token step takes 80 ms, more than the 50 ms target.
    profile = {1: 80.0, 8: 100.0, 32: 160.0, 64: 240.0}
    assert calibrate_latency_cap(profile, tpot_target_ms=50.0, fallback=4, max_cap=64) == 1
    # Target lifted to 2 x 80 = 160 ms: up to the 32-token bucket.
    assert calibrate_latency_cap(profile, tpot_target_ms=50.0, fallback=4, max_cap=64, floor_slack=2.0) == 32
    # Only decode-sized buckets define the floor: a profile of prefill steps leaves the target alone.
    assert calibrate_latency_cap({512: 900.0}, tpot_target_ms=50.0, fallback=4, max_cap=64, floor_slack=2.0) == 1
