"""Sleeping between rate slots (fake clock): the agent's cost follows the output rate."""

from __future__ import annotations

from tensorpool.ratelimiter.gate import RateGate, idle_hint_ns
from tensorpool.ratelimiter.idle import SlotIdleStrategy
from tensorpool.transport.clock import ManualClock
from tensorpool.transport.idle import BackoffIdleStrategy

MS = 1_000_000
CAP = 10 * MS


def closed_gate(rate: int, published_at: int) -> RateGate[int]:
    gate: RateGate[int] = RateGate(rate)
    gate.offer(0, published_at)
    assert gate.poll(published_at) == 0
    gate.published(published_at)
    return gate


def test_hint_is_time_to_the_earliest_slot_capped() -> None:
    g10 = closed_gate(10, 0)  # next slot at 100 ms
    g30 = closed_gate(30, 0)  # next slot at 33.33 ms
    assert idle_hint_ns([g10], 30 * MS, 1000 * MS) == 70 * MS
    assert idle_hint_ns([g10, g30], 30 * MS, 1000 * MS) == 33_333_334 - 30 * MS
    assert idle_hint_ns([g10], 30 * MS, CAP) == CAP  # housekeeping still runs every 10 ms
    assert idle_hint_ns([g10], 100 * MS, CAP) == 0  # due now


def test_hint_is_zero_while_a_slot_is_open_or_unlimited() -> None:
    fresh: RateGate[int] = RateGate(30)  # first frame not seen yet: eligible immediately
    unlimited: RateGate[int] = RateGate(0)
    assert idle_hint_ns([closed_gate(10, 0), fresh], 1 * MS, CAP) == 0
    assert idle_hint_ns([closed_gate(10, 0), unlimited], 1 * MS, CAP) == 0
    assert idle_hint_ns([], 0, CAP) == CAP


def test_strategy_sleeps_the_hint_and_backs_off_otherwise() -> None:
    clock = ManualClock(30 * MS)
    gate = closed_gate(10, 0)
    backoff = BackoffIdleStrategy(max_spins=0, max_yields=0, sleep=clock.sleep, yield_=lambda: None)
    idle = SlotIdleStrategy(
        lambda now: idle_hint_ns([gate], now, 1000 * MS), backoff, clock=clock, sleep=clock.sleep
    )
    idle.idle(0)
    assert clock.sleeps == [70 * MS] and clock() == 100 * MS  # woke exactly at the slot
    idle.idle(3)  # work done: no sleep
    assert len(clock.sleeps) == 1
    gate.offer(1, clock())
    assert gate.poll(clock()) == 1
    gate.published(clock())
    idle.idle(0)
    assert clock.sleeps[-1] == 100 * MS and idle.sleeps == 2
    open_gate: RateGate[int] = RateGate(0)
    busy = SlotIdleStrategy(
        lambda now: idle_hint_ns([open_gate], now, CAP), backoff, clock=clock, sleep=clock.sleep
    )
    before = list(clock.sleeps)
    for _ in range(4):
        busy.idle(0)  # backoff: not-idle -> spinning -> yielding -> parking (1 µs, 2 µs, ...)
    assert busy.sleeps == 0
    assert all(s <= 1 * MS for s in clock.sleeps[len(before) :])
