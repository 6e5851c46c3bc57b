"""Issue #7 rule 6: the multi-buffer scheduler (seed §7, §10.2, §11, §12)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tensorpool.ingest import IngressBuffer, IngressScheduler


def queue(name: str, items: list[Any], capacity: int = 100) -> IngressBuffer:
    buf = IngressBuffer(name, mode="queue", capacity=capacity)
    buf.ingest_many(items)
    return buf


def test_s10_2_strict_buffer_priority_with_leftover_budget() -> None:
    sched = IngressScheduler("facts", max_items_per_tick=5)
    sched.add_buffer(queue("low", ["l1", "l2", "l3"]), priority=5)
    sched.add_buffer(queue("high", ["h1", "h2", "h3"]), priority=10)
    out: list[str] = []
    tick = sched.drain_tick(out.append)
    assert out == ["h1", "h2", "h3", "l1", "l2"]
    assert (tick.processed, tick.pending, tick.budget_exhausted) == (5, 1, True)
    assert {n: s.processed for n, s in tick.buffers.items()} == {"high": 3, "low": 2}
    assert list(tick.buffers) == ["high", "low"]


def test_s11_one_global_budget_per_tick_shared_by_all_buffers_and_lanes() -> None:
    sched = IngressScheduler("s", max_items_per_tick=4)
    laned = IngressBuffer("laned", mode="queue", capacity=50, lane=lambda x: x[0])
    laned.ingest_many([("a", i) for i in range(5)] + [("b", i) for i in range(5)])
    sched.add_buffer(laned, priority=2)
    sched.add_buffer(queue("other", list(range(5))), priority=1)
    seen: list[Any] = []
    ticks = [sched.drain_tick(seen.append) for _ in range(3)]
    assert [t.processed for t in ticks] == [4, 4, 4]
    assert len(seen) == 12
    assert sched.drain_tick(seen.append, max_items=100).processed == 3  # per-tick override
    assert sched.pending == 0


def test_s10_2_buffers_of_equal_priority_take_turns_going_first() -> None:
    sched = IngressScheduler("s", max_items_per_tick=2)
    sched.add_buffer(queue("a", ["a1", "a2", "a3", "a4"]), priority=1)
    sched.add_buffer(queue("b", ["b1", "b2", "b3", "b4"]), priority=1)
    out: list[str] = []
    for _ in range(4):
        sched.drain_tick(out.append)
    assert out == ["a1", "a2", "b1", "b2", "a3", "a4", "b3", "b4"]


def test_s10_2_every_buffer_is_drained_every_tick_even_without_budget() -> None:
    sched = IngressScheduler("s", max_items_per_tick=1)
    high = queue("high", [1, 2, 3])
    low = IngressBuffer("low", mode="latest_by_key", capacity=4, key=lambda x: x)
    sched.add_buffer(high, priority=2)
    sched.add_buffer(low, priority=1)
    low.ingest(None)  # a bad_key drop: reported by low's tick-time drain(0)
    tick = sched.drain_tick(lambda _: None)
    assert tick.buffers["low"].processed == 0
    assert tick.buffers["low"].dropped == 1 and tick.dropped == 1
    assert low.metrics().drain_calls_total == 1


def test_s10_2_per_buffer_handlers_or_one_handler_for_all() -> None:
    sched = IngressScheduler("s", max_items_per_tick=10)
    got_a: list[Any] = []
    got_b: list[Any] = []
    sched.add_buffer(queue("a", [1, 2]), handle=got_a.append)
    sched.add_buffer(queue("b", [3]), handle=got_b.append, priority=2)
    sched.drain_tick()
    assert (got_a, got_b) == ([1, 2], [3])
    sched.add_buffer(queue("c", [4]))
    with pytest.raises(ValueError, match="buffer 'c' has no handler"):
        sched.drain_tick()
    everything: list[Any] = []
    sched.drain_tick(everything.append)
    assert everything == [4]


def test_s10_2_registration_errors() -> None:
    sched = IngressScheduler("s", max_items_per_tick=1)
    sched.add_buffer(queue("a", []))
    with pytest.raises(ValueError, match="already has a buffer named 'a'"):
        sched.add_buffer(queue("a", []))
    with pytest.raises(TypeError, match="priority must be an int"):
        sched.add_buffer(queue("b", []), priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an IngressBuffer"):
        sched.add_buffer(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_items_per_tick must be >= 0"):
        IngressScheduler("s", max_items_per_tick=-1)
    removed = sched.remove_buffer("a")
    assert removed.name == "a" and sched.buffers == ()
    with pytest.raises(KeyError):
        sched.remove_buffer("a")


def test_s12_scheduler_metrics_with_per_buffer_breakdown() -> None:
    sched = IngressScheduler("facts", max_items_per_tick=3)
    a = queue("a", [1, 2, 3, 4], capacity=4)
    b = IngressBuffer("b", mode="latest_by_key", capacity=4, key=lambda x: x[0])
    b.ingest_many([("k", 1), ("k", 2)])
    sched.add_buffer(a, priority=2)
    sched.add_buffer(b, priority=1)
    sched.drain_tick(lambda _: None)  # a: 3 items
    a.ingest(5)
    sched.drain_tick(lambda _: None)  # a: 2 items, b: 1 item
    m = sched.metrics()
    assert (m.name, m.max_items_per_tick, m.ticks_total) == ("facts", 3, 2)
    assert (m.processed_total, m.replaced_total, m.dropped_total) == (6, 1, 0)
    assert (m.pending, m.peak_pending, m.budget_exhausted_total) == (0, 5, 1)
    assert m.last_tick is not None and m.last_tick.processed == 3
    assert m.avg_processed == pytest.approx(3.0)
    assert m.avg_pending == pytest.approx((2 + 0) / 2)  # after tick 1: a=1, b=1 (one key)
    assert m.ema_pending == pytest.approx(2 + 0.1 * (0 - 2))
    assert set(m.buffers) == {"a", "b"}
    assert (m.buffers["a"].priority, m.buffers["a"].processed_total) == (2, 5)
    assert m.buffers["b"].replaced_total == 1
    assert m.buffers["b"].metrics == b.metrics()


def test_s12_scheduler_metrics_reset_resets_children_and_keeps_rotation() -> None:
    def build() -> tuple[IngressScheduler, list[IngressBuffer]]:
        s = IngressScheduler("s", max_items_per_tick=1)
        bufs = [queue("x", [1, 2, 3]), queue("y", [4, 5, 6])]
        for b in bufs:
            s.add_buffer(b)
        return s, bufs

    reset, reset_bufs = build()
    twin, _ = build()
    reset.drain_tick(lambda _: None)
    twin.drain_tick(lambda _: None)
    reset.metrics_reset()
    m = reset.metrics()
    assert (m.ticks_total, m.processed_total, m.avg_processed, m.peak_pending) == (0, 0, None, 5)
    assert all(b.metrics().drained_total == 0 for b in reset_bufs)
    a_out: list[int] = []
    b_out: list[int] = []
    for _ in range(5):
        reset.drain_tick(a_out.append)
        twin.drain_tick(b_out.append)
    assert a_out == b_out


def test_s6_scheduler_time_budget_is_shared_across_buffers(clock_factory: Any) -> None:
    clock = clock_factory(start=0.0)

    def work(_: Any) -> None:
        clock.now += 1.0

    sched = IngressScheduler("s", max_items_per_tick=100)
    sched.add_buffer(queue("hi", list(range(10))), priority=2)
    sched.add_buffer(queue("lo", list(range(10))), priority=1)
    tick = sched.drain_tick(work, max_millis=4, now_millis=clock)
    assert tick.buffers["hi"].processed == 4
    assert tick.buffers["lo"].processed == 0
    assert tick.budget_exhausted and tick.spent_millis == pytest.approx(4.0)


@pytest.mark.parametrize("bad", [0, -1, "5"])
def test_s6_scheduler_misconfigured_time_budget_drains_nothing_and_warns(
    bad: Any, clock_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched = IngressScheduler("s", max_items_per_tick=10)
    sched.add_buffer(queue("a", [1, 2]))
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        tick = sched.drain_tick(lambda _: None, max_millis=bad, now_millis=clock_factory())
    assert (tick.processed, tick.pending, tick.budget_exhausted) == (0, 2, False)
    assert any("max_millis" in r.getMessage() for r in caplog.records)


def test_s6_scheduler_clock_going_backwards_stops_the_tick(
    clock_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched = IngressScheduler("s", max_items_per_tick=10)
    sched.add_buffer(queue("a", [1, 2]), priority=2)
    sched.add_buffer(queue("b", [3, 4]), priority=1)
    # tick start 10, before a: 11, a's own start 11, after item 1: 5 (backwards)
    clock = clock_factory(script=[10.0, 11.0, 11.0, 5.0])
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        tick = sched.drain_tick(lambda _: None, max_millis=100, now_millis=clock)
    assert tick.buffers["a"].processed == 1
    assert tick.buffers["b"].processed == 0
    assert tick.spent_millis is None
    assert any("went backwards" in r.getMessage() for r in caplog.records)


def test_s10_2_drain_tick_is_not_reentrant() -> None:
    sched = IngressScheduler("s", max_items_per_tick=10)
    errors: list[Exception] = []

    def nested(_: Any) -> None:
        try:
            sched.drain_tick(lambda _: None)
        except RuntimeError as exc:
            errors.append(exc)

    sched.add_buffer(queue("a", [1]))
    sched.drain_tick(nested)
    assert len(errors) == 1
