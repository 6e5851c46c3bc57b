"""StreamPeriodEstimator (seed 000, "StreamPeriodEstimator"): ring, medians, integer snap."""

from __future__ import annotations

import pytest

from tensorpool.batching import DIFF_RING_SIZE, MIN_DIFFS_FOR_GATE, StreamPeriodEstimator

S = 1_000_000_000


def feed(est: StreamPeriodEstimator, times_s: list[float]) -> StreamPeriodEstimator:
    for t in times_s:
        est.observe(round(t * S))
    return est


def train(rate_hz: float, n: int, start: float = 100.0) -> list[float]:
    return [start + i / rate_hz for i in range(n)]


def test_estimator_ring_keeps_last_32_positive_diffs() -> None:
    est = feed(StreamPeriodEstimator(), train(14, 100))
    assert DIFF_RING_SIZE == 32
    assert est.diff_count == 32 and est.total_diffs == 99


def test_estimator_needs_min_diffs_before_reporting_a_rate() -> None:
    est = feed(StreamPeriodEstimator(), train(14, MIN_DIFFS_FOR_GATE))  # 3 diffs
    assert est.rate_hz() is None and est.period_ns() is None
    est.observe(round((100 + MIN_DIFFS_FOR_GATE / 14) * S))
    assert est.rate_hz() == 14


def test_estimator_ignores_negative_and_zero_diffs() -> None:
    """Out-of-order (negative) and split (zero) differences never enter the ring."""
    est = StreamPeriodEstimator()
    times = train(14, 10)
    est.observe(round(times[0] * S))
    for t in times[1:]:
        est.observe(round(t * S))
        est.observe(round(t * S))  # split message: same timestamp
        est.observe(round((t - 0.5) * S))  # out-of-order straggler
    assert est.diff_count == 9
    assert all(d > 0 for d in est.diffs)
    assert est.rate_hz() == 14


def test_estimator_robust_to_missing_pulses() -> None:
    """Gaps of 2 and 3 periods are divided by their pulse count k = round(diff / seed)."""
    times = [t for i, t in enumerate(train(14, 80)) if i % 5 != 2 and i % 11 != 7]
    est = feed(StreamPeriodEstimator(), times)
    assert {round(d * 14 / S) for d in est.diffs} == {1, 2, 3}
    assert est.rate_hz() == 14
    assert est.period_ns() == pytest.approx(S / 14, rel=1e-6)


def test_estimator_robust_to_split_messages_and_missing_pulses_together() -> None:
    """Every pulse split in three (same stamp) and every fourth pulse missing: still 5 Hz."""
    times = [t for i, t in enumerate(train(5, 60)) if i % 4 != 3 for _ in range(3)]
    assert feed(StreamPeriodEstimator(), times).rate_hz() == 5


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(14.0, 14), (13.98, 14), (5.0, 5), (1.0, 1), (0.5, None), (0.85, None), (1.5, None)],
)
def test_estimator_snaps_to_integer_hz_within_tolerance(rate: float, expected: int | None) -> None:
    assert feed(StreamPeriodEstimator(), train(rate, 40)).rate_hz() == expected


def test_estimator_state_round_trip() -> None:
    est = feed(StreamPeriodEstimator(), train(14, 50))
    again = StreamPeriodEstimator.from_state(est.to_state())
    assert again.diffs == est.diffs and again.last_ns == est.last_ns
    assert again.total_diffs == est.total_diffs and again.rate_hz() == 14


@pytest.mark.parametrize(
    "state",
    [{"last_ns": 1.5, "diffs": []}, {"last_ns": 1, "diffs": [0]}, {"last_ns": 1, "diffs": ["x"]}],
)
def test_estimator_rejects_malformed_state(state: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="estimator state"):
        StreamPeriodEstimator.from_state(state)


def test_estimator_ring_size_must_cover_min_diffs() -> None:
    with pytest.raises(ValueError, match="ring_size"):
        StreamPeriodEstimator(ring_size=MIN_DIFFS_FOR_GATE - 1)
