"""Idle strategies: escalation and reset, checked with a fake sleep/yield (no real waiting)."""

from __future__ import annotations

import pytest

from tensorpool.transport import (
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    IdleStrategy,
    ManualClock,
    NativeIdleStrategy,
    NoOpIdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
    idle_strategy,
)
from tensorpool.transport.idle import BackoffState


class _Yields:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _backoff(clock: ManualClock, yields: _Yields) -> BackoffIdleStrategy:
    return BackoffIdleStrategy(
        max_spins=3, max_yields=2, min_park_ns=1_000, max_park_ns=8_000,
        sleep=clock.sleep, yield_=yields,
    )  # fmt: skip


def test_backoff_escalates_spin_yield_park_and_caps() -> None:
    clock, yields = ManualClock(), _Yields()
    s = _backoff(clock, yields)
    states = []
    for _ in range(13):
        s.idle(0)
        states.append(s.state)
    S, Y, P = BackoffState.SPINNING, BackoffState.YIELDING, BackoffState.PARKING
    assert states == [S, S, S, Y, Y, Y, P, P, P, P, P, P, P]
    assert yields.count == 2
    # park period doubles from min and is capped at max
    assert clock.sleeps == [1_000, 2_000, 4_000, 8_000, 8_000, 8_000]
    assert clock() == sum(clock.sleeps)


def test_backoff_resets_on_work_and_on_reset() -> None:
    clock, yields = ManualClock(), _Yields()
    s = _backoff(clock, yields)
    for _ in range(9):
        s.idle(0)
    assert s.state is BackoffState.PARKING and s.park_period_ns > s.min_park_ns
    s.idle(5)
    assert s.state is BackoffState.NOT_IDLE
    assert s.park_period_ns == s.min_park_ns
    for _ in range(4):
        s.idle(0)
    assert s.state is BackoffState.YIELDING  # escalation starts over from spinning
    s.reset()
    assert (s.state, s.spins, s.yields) == (BackoffState.NOT_IDLE, 0, 0)
    s.idle(0)
    assert s.state is BackoffState.SPINNING
    assert clock.sleeps == [1_000, 2_000]  # no sleeps after the reset


def test_backoff_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        BackoffIdleStrategy(min_park_ns=0)
    with pytest.raises(ValueError):
        BackoffIdleStrategy(min_park_ns=10, max_park_ns=5)
    with pytest.raises(ValueError):
        BackoffIdleStrategy(max_spins=-1)


def test_sleeping_and_yielding_wait_only_without_work() -> None:
    clock = ManualClock()
    sleeping = SleepingIdleStrategy(250_000, sleep=clock.sleep)
    sleeping.idle(3)
    sleeping.idle(0)
    assert clock.sleeps == [250_000]
    yields = _Yields()
    yielding = YieldingIdleStrategy(yields)
    yielding.idle(1)
    yielding.idle(0)
    yielding.idle(0)
    assert yields.count == 2
    with pytest.raises(ValueError):
        SleepingIdleStrategy(0)


@pytest.mark.parametrize("name", ["noop", "busy_spin", "yield", "sleep", "backoff"])
@pytest.mark.parametrize("native", [False, True])
def test_factory_builds_every_strategy(name: str, native: bool) -> None:
    params = {"sleep_ns": 1_000} if name == "sleep" else {}
    s = idle_strategy(name, native=native, **params)
    assert isinstance(s, IdleStrategy)
    s.idle(1)
    s.idle(0)
    s.reset()
    assert isinstance(s, NativeIdleStrategy) is native


def test_factory_rejects_unknown_names_and_params() -> None:
    with pytest.raises(ValueError, match="unknown idle strategy"):
        idle_strategy("spinny")
    with pytest.raises(ValueError, match="sleep_ns"):
        idle_strategy("backoff", sleep_ns=5)
    assert isinstance(idle_strategy("busy_spin"), BusySpinIdleStrategy)
    assert isinstance(idle_strategy("noop"), NoOpIdleStrategy)
