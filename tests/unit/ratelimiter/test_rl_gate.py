"""The rate gate with a fake clock (RateLimiter Spec §4, §7): rate accuracy, most recent frame,
first frame immediately, resets, ConsumerHello authority. No wall clock anywhere."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.ratelimiter.gate import MODE_RATE_LIMITED, MODE_STREAM, NULL_RATE, RateGate
from tensorpool.transport.clock import ManualClock

SEC = 1_000_000_000
MS = 1_000_000


def simulate(
    rate_hz: int,
    *,
    source_hz: int = 1000,
    seconds: int = 10,
    seed: int = 1,
    max_wake_ns: int = 2 * MS,
) -> list[tuple[int, int]]:
    """A steady source and an agent that wakes at random moments (0..max_wake_ns apart).

    At each wake the agent offers every frame that arrived since the last wake, then polls
    the gate once — exactly what the relay does per duty cycle. Returns (publish time, seq).
    """
    rng = random.Random(seed)
    clock = ManualClock(0)
    gate: RateGate[int] = RateGate(rate_hz)
    period = SEC // source_hz
    next_frame = 0
    seq = 0
    out: list[tuple[int, int]] = []
    end = seconds * SEC
    while clock() < end:
        clock.advance(rng.randint(1, max_wake_ns))
        now = clock()
        while next_frame <= now and next_frame < end:
            immediate = gate.offer(seq, now)
            if immediate is not None:
                out.append((now, immediate))
                gate.published(now)
            seq += 1
            next_frame += period
        item = gate.poll(now)
        if item is not None:
            out.append((now, item))
            gate.published(now)
    return out


def per_second(publishes: list[tuple[int, int]], seconds: int) -> list[int]:
    counts = [0] * seconds
    for t, _ in publishes:
        if t < seconds * SEC:
            counts[t // SEC] += 1
    return counts


@pytest.mark.parametrize("rate", [1, 5, 10, 30, 60, 100, 250, 500])
def test_s4_rate_accuracy_1khz_source_no_drift(rate: int) -> None:
    """§4 rate-limit: a steady 1 kHz source limited to r Hz publishes r ± 1 frames in every
    second of a 10 s run (no drift from late wake-ups) — e.g. 30 ± 1 per second at 30 Hz.
    The agent wakes at random, up to half a rate period (at most 2 ms) late."""
    pubs = simulate(rate, max_wake_ns=min(2 * MS, SEC // rate // 2), seed=rate)
    counts = per_second(pubs, 10)
    assert all(rate - 1 <= c <= rate + 1 for c in counts), counts
    assert abs(len(pubs) - 10 * rate) <= 1


@pytest.mark.parametrize("max_wake_ms", [1, 5, 20])
def test_s4_rate_accuracy_with_slow_agent_wakeups(max_wake_ms: int) -> None:
    """§4: late wake-ups (up to 20 ms with a 33 ms period) do not push later slots back."""
    pubs = simulate(30, max_wake_ns=max_wake_ms * MS, seed=max_wake_ms)
    assert abs(len(pubs) - 300) <= 1, len(pubs)


def test_s4_at_most_rate_in_any_one_second_window() -> None:
    """§4 "at most max_rate_hz": every 1 s window holds at most r + 1 publishes (grid edges),
    and no two publishes share a slot of the grid."""
    for rate in (7, 30, 240):
        times = [t for t, _ in simulate(rate, seconds=5, seed=rate)]
        j = 0
        for i, t in enumerate(times):
            while times[j] <= t - SEC:
                j += 1
            assert i - j + 1 <= rate + 1


def test_s4_slow_source_passes_every_frame() -> None:
    """§4: a source slower than the limit is not thinned (20 Hz under a 30 Hz limit)."""
    pubs = simulate(30, source_hz=20, seconds=5)
    assert [s for _, s in pubs] == list(range(100))


def test_s4_most_recent_frame_is_published_when_slot_opens() -> None:
    """§4 SHOULD: when the slot opens, the newest frame available is published — not the
    first one that arrived after the slot opened."""
    gate: RateGate[str] = RateGate(10)  # 100 ms slots
    assert gate.offer("a", 0) is None
    assert gate.poll(0) == "a"  # first frame: immediately
    gate.published(0)
    for i, t in enumerate(range(10 * MS, 100 * MS, 10 * MS)):
        gate.offer(f"b{i}", t)
        assert gate.poll(t) is None  # slot closed: held, replaced by each newer frame
    # The slot opened at 100 ms; three frames arrived after it before the agent woke up.
    for name, t in (("c1", 101 * MS), ("c2", 102 * MS), ("c3", 103 * MS)):
        gate.offer(name, t)
    assert gate.poll(104 * MS) == "c3"
    gate.published(104 * MS)
    assert gate.stats.superseded == 11
    assert gate.poll(105 * MS) is None


def test_s4_first_frame_after_start_is_immediate() -> None:
    """§4: the first frame after start is eligible immediately, at any clock value."""
    gate: RateGate[int] = RateGate(1)
    gate.offer(7, 123_456_789)
    assert gate.poll(123_456_789) == 7


def test_s4_s7_timer_resets_on_source_epoch_change() -> None:
    """§4/§7: a source epoch change drops the pending frame and resets the timer, so the
    first frame of the new epoch goes out at once although the old slot is still closed."""
    gate: RateGate[tuple[int, int]] = RateGate(2)  # 500 ms slots
    gate.offer((1, 0), 0)
    assert gate.poll(0) == (1, 0)
    gate.published(0)
    gate.offer((1, 1), 10 * MS)
    assert gate.poll(10 * MS) is None  # closed until 500 ms
    dropped = gate.reset(20 * MS)  # the source moved to epoch 2
    assert dropped == 1 and not gate.has_pending
    assert gate.stats.discarded_on_reset == 1
    gate.offer((2, 0), 30 * MS)
    assert gate.poll(30 * MS) == (2, 0)  # eligible immediately
    gate.published(30 * MS)
    gate.offer((2, 1), 40 * MS)
    assert gate.poll(529 * MS) is None  # new grid anchored at 30 ms
    assert gate.poll(530 * MS) == (2, 1)


def test_s4_timer_resets_on_restart() -> None:
    """§4: a restarted rate limiter is a new gate: its first frame is immediate."""
    first: RateGate[int] = RateGate(1)
    first.offer(1, 5 * SEC)
    assert first.poll(5 * SEC) == 1
    first.published(5 * SEC)
    restarted: RateGate[int] = RateGate(1)
    restarted.offer(2, 5 * SEC + 1)
    assert restarted.poll(5 * SEC + 1) == 2


def test_s4_failed_publish_keeps_slot_open() -> None:
    """A frame dropped during re-materialization does not use up the slot: the next frame
    goes out at once (the slot is for frames that reach the destination)."""
    gate: RateGate[int] = RateGate(10)
    gate.offer(1, 0)
    assert gate.poll(0) == 1  # the agent failed to publish it: no published() call
    gate.offer(2, 1 * MS)
    assert gate.poll(1 * MS) == 2


def test_s4_zero_rate_means_unlimited() -> None:
    """§4: max_rate_hz = 0 is unlimited: every frame is handed back for publishing at once."""
    gate: RateGate[int] = RateGate(0)
    assert [gate.offer(i, 0) for i in range(5)] == list(range(5))
    assert not gate.has_pending


def test_s4_consumer_hello_is_authoritative_over_config() -> None:
    """§4: ConsumerHello.max_rate_hz (mode RATE_LIMITED) overrides the configured rate."""
    gate: RateGate[int] = RateGate(30)
    assert gate.on_consumer_hello(42, MODE_RATE_LIMITED, 5)
    assert gate.rate_hz == 5 and gate.hello_rate_hz == 5 and gate.fallback_rate_hz == 30
    assert not gate.set_fallback_rate(50)  # config changes do not override the consumer
    assert gate.rate_hz == 5
    pubs = 0
    for ms in range(0, 2000):
        gate.offer(ms, ms * MS)
        if gate.poll(ms * MS) is not None:
            gate.published(ms * MS)
            pubs += 1
    assert pubs == 10  # 5 Hz for 2 s


def test_s4_consumer_hello_zero_means_unlimited() -> None:
    """§4: a consumer asking for 0 gets every frame, whatever the config says."""
    gate: RateGate[int] = RateGate(30)
    gate.on_consumer_hello(1, MODE_RATE_LIMITED, 0)
    assert gate.rate_hz == 0
    assert [gate.offer(i, i) for i in range(3)] == [0, 1, 2]


def test_s4_stream_mode_hello_is_not_a_rate_request() -> None:
    """Wire §11: max_rate_hz is authoritative only with mode=RATE_LIMITED; a STREAM hello
    (which carries 0) must not turn the limiter off; a null rate is no request either."""
    gate: RateGate[int] = RateGate(30)
    assert not gate.on_consumer_hello(1, MODE_STREAM, 0)
    assert not gate.on_consumer_hello(1, MODE_RATE_LIMITED, NULL_RATE)
    assert gate.rate_hz == 30 and gate.hello_rate_hz is None


@pytest.mark.parametrize(("first", "second"), [(20, 5), (5, 20)])
def test_s4_no_aggregation_across_consumers(first: int, second: int) -> None:
    """§4 MUST NOT aggregate: with two consumers asking different rates the latest request
    rules — neither the max nor the min of the two."""
    gate: RateGate[int] = RateGate(30)
    gate.on_consumer_hello(1, MODE_RATE_LIMITED, first)
    gate.on_consumer_hello(2, MODE_RATE_LIMITED, second)
    assert gate.rate_hz == second and gate.hello_consumer_id == 2


def test_s4_rate_change_reanchors_after_last_publish() -> None:
    """A new rate applies from the last publish: next slot = last publish + new period."""
    gate: RateGate[int] = RateGate(1)
    gate.offer(1, 0)
    assert gate.poll(0) == 1
    gate.published(0)
    gate.offer(2, 10 * MS)
    gate.on_consumer_hello(9, MODE_RATE_LIMITED, 10)  # 100 ms slots from t=0
    assert gate.poll(99 * MS) is None
    assert gate.poll(100 * MS) == 2


def test_s4_next_slot_reports_when_pending_becomes_due() -> None:
    gate: RateGate[int] = RateGate(4)
    assert gate.next_slot_ns() is None
    gate.offer(1, 0)
    gate.poll(0)
    gate.published(0)
    gate.offer(2, 1)
    assert gate.next_slot_ns() == 250 * MS
    assert not gate.is_open(249 * MS) and gate.is_open(250 * MS)


def test_gate_rejects_negative_rates() -> None:
    with pytest.raises(ValueError, match="fallback_rate_hz"):
        RateGate(-1)
    with pytest.raises(ValueError, match="rate_hz"):
        RateGate(1).set_fallback_rate(-5)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 400),
    steps=st.lists(st.tuples(st.integers(1, 20 * MS), st.integers(0, 4)), min_size=1, max_size=300),
)
def test_s4_property_most_recent_and_at_most_rate(rate: int, steps: list[tuple[int, int]]) -> None:
    """§4, any arrival pattern: (1) a published frame is always the newest offered so far;
    (2) publishes are at least one grid slot apart, i.e. at most r + 1 in any second;
    (3) the first frame offered is published at the first poll."""
    gate: RateGate[int] = RateGate(rate)
    now = 0
    seq = 0
    times: list[int] = []
    for dt, arrivals in steps:
        now += dt
        for _ in range(arrivals):
            gate.offer(seq, now)
            seq += 1
        item = gate.poll(now)
        if item is not None:
            assert item == seq - 1
            if not times:
                assert item == 0 or seq - 1 == item
            gate.published(now)
            times.append(now)
    period = SEC / rate
    for a, b in itertools.pairwise(times):
        assert b > a
    j = 0
    for i, t in enumerate(times):
        while times[j] <= t - SEC:
            j += 1
        assert i - j + 1 <= rate + 1
    if times:
        assert len(times) <= (times[-1] - times[0]) / period + 2
