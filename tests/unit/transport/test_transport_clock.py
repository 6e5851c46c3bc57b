"""now_ns is CLOCK_MONOTONIC: shared by pyaeron and by every process on the host (§15.7)."""

from __future__ import annotations

import subprocess
import sys
import time

import pyaeron
import pytest

from tensorpool.transport import ManualClock, now_ns


def test_s15_7_now_ns_is_clock_monotonic() -> None:
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    b = now_ns()
    c = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert a <= b <= c


def test_pyaeron_nano_clock_is_the_same_clock() -> None:
    """Interleaved readings of both clocks never go backwards, so they are interchangeable."""
    readings = []
    for _ in range(1000):
        readings.append(now_ns())
        readings.append(pyaeron.nano_clock())
    assert readings == sorted(readings)


def test_s10_1_1_monotonic_timestamps_compare_across_processes() -> None:
    """A MONOTONIC timestamp taken in another process lies between our before/after readings."""
    before = now_ns()
    out = subprocess.run(
        [sys.executable, "-c", "from tensorpool.transport import now_ns; print(now_ns())"],
        capture_output=True,
        text=True,
        check=True,
    )
    after = now_ns()
    assert before <= int(out.stdout) <= after


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(100)
    assert clock() == 100
    assert clock.advance(50) == 150
    clock.sleep(0.000_002)
    assert clock() == 2_150 and clock.sleeps == [2_000]
    clock.set(3_000)
    with pytest.raises(ValueError):
        clock.set(10)
    with pytest.raises(ValueError):
        clock.advance(-1)
