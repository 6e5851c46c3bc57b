"""Issue #7 rule 3: budgeted drain, time budgets and clocks, lane priority, drain stats
(seed §6, §6.1, §7, §11)."""

from __future__ import annotations

import logging
import math
from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import DrainStats, IngressBuffer

KEY = itemgetter(0)
LANE = itemgetter(1)


def noop(_: Any) -> None:
    return None


def filled(n: int, **kw: Any) -> IngressBuffer:
    buf = IngressBuffer("b", mode="queue", capacity=max(n, 1), **kw)
    buf.ingest_many(range(n))
    return buf


def test_s6_drain_hands_at_most_max_items() -> None:
    buf = filled(10)
    out: list[int] = []
    stats = buf.drain(4, out.append)
    assert out == [0, 1, 2, 3]
    assert stats == DrainStats(processed=4, pending=6, dropped=0, replaced=0, spent_millis=None)
    assert buf.drain(100, out.append).processed == 6
    assert buf.drain(100, out.append) == DrainStats(0, 0, 0, 0, None)


def test_s6_max_items_zero_is_a_drain_call_without_items() -> None:
    buf = filled(3)
    stats = buf.drain(0, noop)
    assert (stats.processed, stats.pending) == (0, 3)
    assert buf.metrics().drain_calls_total == 1


def test_s6_bad_max_items_is_a_clear_error() -> None:
    buf = filled(3)
    with pytest.raises(ValueError, match="max_items must be >= 0"):
        buf.drain(-1, noop)
    with pytest.raises(TypeError, match="max_items must be an int"):
        buf.drain(True, noop)
    with pytest.raises(TypeError, match="max_items must be an int"):
        buf.drain("3", noop)  # type: ignore[arg-type]
    assert buf.pending == 3 and buf.metrics().drain_calls_total == 0


def test_s6_max_millis_limits_time_spent_with_a_host_clock(clock_factory: Any) -> None:
    """Each handled item costs 2 ms on the host clock; a 5 ms budget stops after the item
    that crosses it (the check runs after each item)."""
    clock = clock_factory(start=100.0)

    def slow(_: Any) -> None:
        clock.now += 2.0

    buf = filled(10)
    stats = buf.drain(10, slow, max_millis=5, now_millis=clock)
    assert stats.processed == 3
    assert stats.pending == 7
    assert stats.spent_millis == pytest.approx(6.0)


def test_s6_item_budget_still_binds_under_a_time_budget(clock_factory: Any) -> None:
    buf = filled(10)
    stats = buf.drain(4, noop, max_millis=1000, now_millis=clock_factory(step=0.001))
    assert stats.processed == 4
    assert stats.spent_millis is not None and stats.spent_millis >= 0


def test_s6_max_millis_without_clock_is_ignored_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    buf = filled(10)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        first = buf.drain(4, noop, max_millis=0.000001)
        second = buf.drain(4, noop, max_millis=0.000001)
    assert (first.processed, second.processed) == (4, 4)  # item budget is the limiter
    assert first.spent_millis is None
    assert sum("time budget ignored" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("bad", [0, -5, math.nan, "10", True])
def test_s6_max_millis_not_positive_drains_zero_and_warns(
    bad: Any, clock_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    buf = filled(5)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        stats = buf.drain(5, noop, max_millis=bad, now_millis=clock_factory())
    assert stats.processed == 0 and stats.pending == 5
    assert any("max_millis" in r.getMessage() for r in caplog.records)
    assert buf.drain(5, noop).processed == 5  # the next, well-formed drain works


@pytest.mark.parametrize("reading", [None, "12:00", math.nan, math.inf, True, object()])
def test_s6_non_numeric_clock_drains_zero_and_warns(
    reading: Any, clock_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    buf = filled(5)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        stats = buf.drain(5, noop, max_millis=10, now_millis=clock_factory(script=[reading]))
    assert (stats.processed, stats.pending, stats.spent_millis) == (0, 5, None)
    assert any("not a number" in r.getMessage() for r in caplog.records)


def test_s6_clock_going_backwards_during_a_drain_stops_it_and_warns(
    clock_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's "drain 0 items for that tick": nothing more is handed out once the clock is
    seen going backwards; items already handled cannot be taken back, and no spent_millis."""
    clock = clock_factory(script=[10.0, 11.0, 9.0, 12.0, 13.0])
    buf = filled(5)
    out: list[int] = []
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        stats = buf.drain(5, out.append, max_millis=100, now_millis=clock)
    assert out == [0, 1]  # the backwards reading is taken after item 1: stop there
    assert (stats.processed, stats.pending, stats.spent_millis) == (2, 3, None)
    assert any("went backwards" in r.getMessage() for r in caplog.records)


def test_s6_clock_going_backwards_at_the_first_check_hands_out_one_item_at_most(
    clock_factory: Any,
) -> None:
    buf = filled(5)
    stats = buf.drain(5, noop, max_millis=100, now_millis=clock_factory(script=[10.0, 5.0]))
    assert stats.processed == 1 and stats.spent_millis is None


def test_s6_spent_millis_only_when_timing_is_usable(clock_factory: Any) -> None:
    buf = filled(6)
    assert buf.drain(1, noop).spent_millis is None  # no clock
    assert buf.drain(1, noop, now_millis=clock_factory(step=0.5)).spent_millis == 0.5
    backwards_at_end = clock_factory(script=[10.0, 3.0])
    assert buf.drain(1, noop, now_millis=backwards_at_end).spent_millis is None


def test_s7_strict_lane_priority_drains_higher_lanes_first() -> None:
    buf = IngressBuffer(
        "b", mode="queue", capacity=20, lane=LANE, lane_priority={"urgent": 3, "normal": 2, "bg": 1}
    )
    for i in range(3):
        buf.ingest((i, "bg"))
        buf.ingest((i, "normal"))
        buf.ingest((i, "urgent"))
    out: list[Any] = []
    buf.drain(4, out.append)
    assert out == [(0, "urgent"), (1, "urgent"), (2, "urgent"), (0, "normal")]
    out.clear()
    buf.drain(10, out.append)  # leftover budget flows down the priorities
    assert out == [(1, "normal"), (2, "normal"), (0, "bg"), (1, "bg"), (2, "bg")]


def test_s7_equal_priority_lanes_share_the_budget_round_robin() -> None:
    """Our tie rule (seed leaves it open): one item per lane in turn, and the next drain
    starts with the lane after the last one served, so no equal lane is starved."""
    buf = IngressBuffer("b", mode="queue", capacity=30, lane=LANE)
    for i in range(5):
        for lane in "abc":
            buf.ingest((i, lane))
    out: list[Any] = []
    buf.drain(4, out.append)
    assert out == [(0, "a"), (0, "b"), (0, "c"), (1, "a")]
    out.clear()
    buf.drain(4, out.append)
    assert out == [(1, "b"), (1, "c"), (2, "a"), (2, "b")]


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
def test_s7_round_robin_in_keyed_modes_too(mode: str) -> None:
    buf = IngressBuffer("b", mode=mode, capacity=30, key=KEY, lane=LANE, ordering="fifo")
    for i in range(3):
        for lane in "ab":
            buf.ingest((f"{lane}{i}", lane))
    out: list[Any] = []
    buf.drain(6, out.append)
    assert [k for k, _ in out] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_s7_time_budget_keeps_priority_and_round_robin(clock_factory: Any) -> None:
    buf = IngressBuffer("b", mode="queue", capacity=30, lane=LANE, lane_priority={"u": 2})
    for i in range(2):
        for lane in "abu":
            buf.ingest((i, lane))
    out: list[Any] = []
    buf.drain(5, out.append, max_millis=1e9, now_millis=clock_factory(step=1.0))
    assert out == [(0, "u"), (1, "u"), (0, "a"), (0, "b"), (1, "a")]


def test_s6_1_dropped_and_replaced_are_deltas_since_the_previous_drain() -> None:
    buf = IngressBuffer("b", mode="latest_by_key", capacity=2, key=KEY)
    buf.ingest(("a", 1))
    buf.ingest(("a", 2))  # replaced
    buf.ingest(("b", 1))
    buf.ingest(("c", 1))  # evicts a
    buf.ingest((None, 0))  # bad_key, counted as a drop too
    first = buf.drain(1, noop)
    assert (first.dropped, first.replaced) == (2, 1)
    second = buf.drain(1, noop)
    assert (second.dropped, second.replaced) == (0, 0)
    buf.ingest(("d", 1))
    buf.ingest(("d", 2))
    third = buf.drain(0, noop)
    assert (third.dropped, third.replaced) == (0, 1)


def test_s6_1_misconfigured_drain_still_reports_and_consumes_the_deltas(
    clock_factory: Any,
) -> None:
    buf = IngressBuffer("b", mode="queue", capacity=1)
    buf.ingest(1)
    buf.ingest(2)
    bad = buf.drain(1, noop, max_millis=-1, now_millis=clock_factory())
    assert (bad.processed, bad.dropped) == (0, 1)
    assert buf.drain(1, noop).dropped == 0


def test_handler_exception_propagates_and_leaves_a_consistent_buffer() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=2)
    buf.ingest(1)
    buf.ingest(2)
    buf.ingest(3)  # one drop pending in the delta

    def boom(x: int) -> None:
        if x == 3:
            raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        buf.drain(5, boom)
    m = buf.metrics()
    assert (m.pending, m.drained_total, m.drain_calls_total) == (0, 2, 1)
    assert m.last_drain is None
    again = buf.drain(5, noop)
    assert (again.processed, again.dropped) == (0, 1)  # the delta rolled over
    buf.ingest(4)
    assert buf.drain(5, noop).processed == 1


def test_drain_is_not_reentrant() -> None:
    buf = filled(3)
    errors: list[Exception] = []

    def nested(_: Any) -> None:
        try:
            buf.drain(1, noop)
        except RuntimeError as exc:
            errors.append(exc)

    assert buf.drain(1, nested).processed == 1
    assert len(errors) == 1 and "not reentrant" in str(errors[0])
    assert buf.drain(5, noop).processed == 2
