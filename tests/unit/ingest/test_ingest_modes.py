"""Issue #7 rule 1: mode semantics, keyed ordering and queue overflow policies (seed §5, §11)."""

from __future__ import annotations

import logging
from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import (
    DropInfo,
    DropReason,
    IngestResult,
    IngressBuffer,
    IngressOverflowError,
)

KEY = itemgetter(0)
LANE = itemgetter(1)


def drain_all(buf: IngressBuffer, n: int = 1000) -> list[Any]:
    out: list[Any] = []
    buf.drain(n, out.append)
    return out


def test_s5_1_dedup_set_keeps_first_item_and_counts_deduped() -> None:
    buf = IngressBuffer("b", mode="dedup_set", capacity=10, key=KEY)
    assert buf.ingest(("sq1", "first")) is IngestResult.ENQUEUED
    assert buf.ingest(("sq1", "second")) is IngestResult.DEDUPED
    assert buf.ingest(("sq2", "x")) is IngestResult.ENQUEUED
    assert buf.pending == 2
    m = buf.metrics()
    assert (m.ingested_total, m.enqueued_total, m.deduped_total, m.replaced_total) == (3, 2, 1, 0)
    assert sorted(drain_all(buf)) == [("sq1", "first"), ("sq2", "x")]


def test_s5_2_latest_by_key_replaces_item_and_counts_replaced() -> None:
    buf = IngressBuffer("b", mode="latest_by_key", capacity=10, key=KEY)
    buf.ingest(("hp", 100))
    assert buf.ingest(("hp", 90)) is IngestResult.REPLACED
    assert buf.ingest(("hp", 80)) is IngestResult.REPLACED
    assert buf.pending == 1
    m = buf.metrics()
    assert (m.ingested_total, m.enqueued_total, m.deduped_total, m.replaced_total) == (3, 1, 0, 2)
    assert drain_all(buf) == [("hp", 80)]


def test_s5_3_queue_keeps_every_item_in_arrival_order() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=10)
    for x in ("a", "a", "b", "a"):
        assert buf.ingest(x) is IngestResult.ENQUEUED
    assert drain_all(buf) == ["a", "a", "b", "a"]


def test_s5_3_queue_is_fifo_per_lane() -> None:
    """Seed §5.3 decision: each lane has its own FIFO; lanes of one priority take turns."""
    buf = IngressBuffer("b", mode="queue", capacity=10, lane=LANE)
    for item in [(1, "x"), (2, "x"), (3, "y"), (4, "x"), (5, "y")]:
        buf.ingest(item)
    out = drain_all(buf)
    assert [i for i, ln in out if ln == "x"] == [1, 2, 4]
    assert [i for i, ln in out if ln == "y"] == [3, 5]


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
def test_s11_ordering_fifo_is_first_enqueue_order_reingest_keeps_position(mode: str) -> None:
    """Seed §11: fifo = oldest first enqueue first; re-ingest refreshes last-seen only."""
    buf = IngressBuffer("b", mode=mode, capacity=10, key=KEY, ordering="fifo")
    for k in ("a", "b", "c"):
        buf.ingest((k, 0))
    buf.ingest(("a", 1))  # re-ingest: must not move "a" behind "c"
    buf.ingest(("b", 1))
    assert [k for k, _ in drain_all(buf)] == ["a", "b", "c"]


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
def test_s11_ordering_fifo_applies_within_each_lane(mode: str) -> None:
    buf = IngressBuffer(
        "b", mode=mode, capacity=10, key=KEY, lane=LANE, ordering="fifo", lane_priority={"u": 2}
    )
    for item in [("k1", "l"), ("k2", "u"), ("k3", "l"), ("k4", "u")]:
        buf.ingest(item)
    buf.ingest(("k1", "l"))
    buf.ingest(("k2", "u"))
    assert [k for k, _ in drain_all(buf)] == ["k2", "k4", "k1", "k3"]


def test_s11_ordering_none_promises_nothing_but_drains_least_recently_seen_first() -> None:
    """Our choice for "none" (documented, not a guarantee): the cheapest order we have, LRU."""
    buf = IngressBuffer("b", mode="dedup_set", capacity=10, key=KEY)
    for k in ("a", "b", "c"):
        buf.ingest((k, 0))
    buf.ingest(("a", 1))
    assert [k for k, _ in drain_all(buf)] == ["b", "c", "a"]


def test_s11_ordering_is_ignored_for_queue_and_warned_on_every_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    buf = IngressBuffer("q", mode="queue", capacity=4, ordering="fifo")
    for x in (1, 2, 3):
        buf.ingest(x)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        buf.drain(1, lambda _: None)
        buf.drain(0, lambda _: None)
        buf.drain(5, lambda _: None)
    warnings = [r for r in caplog.records if "ignored in mode 'queue'" in r.getMessage()]
    assert len(warnings) == 3
    caplog.clear()
    quiet = IngressBuffer("q2", mode="queue", capacity=4)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        quiet.drain(1, lambda _: None)
    assert not caplog.records


def test_s5_3_overflow_drop_oldest_is_counted_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Seed §9: overflow is explicit by being counted and hooked; no log, no extra stream."""
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode="queue", capacity=3, on_drop=drops.append)
    with caplog.at_level(logging.DEBUG, logger="tensorpool.ingest"):
        for x in range(5):
            assert buf.ingest(x) is IngestResult.ENQUEUED
    assert not caplog.records
    assert drain_all(buf) == [2, 3, 4]
    assert [(d.reason, d.item) for d in drops] == [
        (DropReason.DROP_OLDEST, 0),
        (DropReason.DROP_OLDEST, 1),
    ]
    assert buf.metrics().dropped_by_reason == {"bad_key": 0, "drop_oldest": 2}


def test_s5_3_overflow_drop_newest() -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode="queue", capacity=3, overflow="drop_newest", on_drop=drops.append)
    results = [buf.ingest(x) for x in range(5)]
    assert results[3:] == [IngestResult.DROPPED, IngestResult.DROPPED]
    assert drain_all(buf) == [0, 1, 2]
    assert [(d.reason, d.item) for d in drops] == [
        (DropReason.DROP_NEWEST, 3),
        (DropReason.DROP_NEWEST, 4),
    ]


def test_s5_3_overflow_drop_newest_of_a_lower_lane_admits_the_arrival() -> None:
    buf = IngressBuffer(
        "b", mode="queue", capacity=3, overflow="drop_newest", lane=LANE, lane_priority={"hi": 2}
    )
    for item in [(1, "lo"), (2, "lo"), (3, "hi")]:
        buf.ingest(item)
    assert buf.ingest((4, "hi")) is IngestResult.ENQUEUED
    assert drain_all(buf) == [(3, "hi"), (4, "hi"), (1, "lo")]


def test_s5_3_overflow_drop_buffer_clears_the_losing_lane() -> None:
    """Seed §5.3 names "drop buffer": the losing lane's whole FIFO goes (arrival included
    when its own lane loses); other lanes keep their items."""
    drops: list[DropInfo] = []
    buf = IngressBuffer(
        "b",
        mode="queue",
        capacity=3,
        overflow="drop_buffer",
        lane=LANE,
        lane_priority={"hi": 2},
        on_drop=drops.append,
    )
    for item in [(1, "lo"), (2, "lo"), (3, "hi")]:
        buf.ingest(item)
    assert buf.ingest((4, "hi")) is IngestResult.ENQUEUED  # "lo" loses both its items
    assert buf.pending == 2
    assert [d.item for d in drops] == [(1, "lo"), (2, "lo")]
    assert buf.ingest((5, "lo")) is IngestResult.ENQUEUED
    assert buf.ingest((6, "lo")) is IngestResult.DROPPED  # "lo" loses again, arrival too
    assert [d.item for d in drops][2:] == [(5, "lo"), (6, "lo")]
    assert {d.reason for d in drops} == {DropReason.DROP_BUFFER}
    assert drain_all(buf) == [(3, "hi"), (4, "hi")]


def test_s5_3_overflow_fail_raises_counts_logs_and_keeps_contents(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode="queue", capacity=2, overflow="fail", on_drop=drops.append)
    buf.ingest("a")
    buf.ingest("b")
    with (
        caplog.at_level(logging.WARNING, logger="tensorpool.ingest"),
        pytest.raises(IngressOverflowError) as err,
    ):
        buf.ingest("c")
    assert err.value.item == "c" and err.value.capacity == 2 and err.value.buffer == "b"
    assert any("refused (reason overflow)" in r.getMessage() for r in caplog.records)
    assert [(d.reason, d.item) for d in drops] == [(DropReason.OVERFLOW, "c")]
    m = buf.metrics()
    assert (m.pending, m.ingested_total, m.dropped_by_reason["overflow"]) == (2, 2, 1)
    stats = buf.drain(10, lambda _: None)
    assert (stats.processed, stats.dropped) == (2, 1)
    assert buf.ingest("d") is IngestResult.ENQUEUED


def test_ingest_many_matches_the_loop_and_fills_a_queue_in_one_call() -> None:
    a = IngressBuffer("q", mode="queue", capacity=5)
    b = IngressBuffer("q", mode="queue", capacity=5)
    for x in range(12):
        a.ingest(x)
    b.ingest_many(iter(range(12)))
    assert a.metrics() == b.metrics()
    assert drain_all(a) == drain_all(b) == [7, 8, 9, 10, 11]
    keyed = IngressBuffer("k", mode="latest_by_key", capacity=5, key=KEY)
    keyed.ingest_many([("x", 1), ("x", 2), ("y", 3)])
    assert sorted(drain_all(keyed)) == [("x", 2), ("y", 3)]
