"""Issue #7 rule 2: capacity and eviction exactly as the seed decides (§5, §11)."""

from __future__ import annotations

import logging
from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import DropInfo, DropReason, IngestResult, IngressBuffer

KEY = itemgetter(0)
LANE = itemgetter(1)


def drain_all(buf: IngressBuffer) -> list[Any]:
    out: list[Any] = []
    buf.drain(10_000, out.append)
    return out


def test_s5_capacity_counts_unique_pending_keys_in_keyed_modes() -> None:
    for mode in ("dedup_set", "latest_by_key"):
        buf = IngressBuffer("b", mode=mode, capacity=2, key=KEY)
        for item in [("a", 1), ("a", 2), ("a", 3), ("b", 1)]:
            buf.ingest(item)
        assert buf.pending == 2
        assert buf.metrics().dropped_total == 0  # repeats of a pending key cost no capacity


def test_s5_capacity_counts_items_in_queue_mode() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=2)
    for x in ("a", "a", "a"):
        buf.ingest(x)
    assert buf.pending == 2
    assert buf.metrics().dropped_total == 1


@pytest.mark.parametrize("mode", ["queue", "dedup_set"])
def test_s11_capacity_is_global_across_lanes(mode: str) -> None:
    buf = IngressBuffer("b", mode=mode, capacity=3, key=KEY, lane=LANE)
    for i, lane in enumerate("abcd"):
        buf.ingest((i, lane))
    lanes = buf.metrics().lanes
    assert buf.pending == 3
    assert sum(lm.pending for lm in lanes.values()) == 3
    assert sum(lm.dropped_total for lm in lanes.values()) == 1


@pytest.mark.parametrize("mode", ["queue", "dedup_set", "latest_by_key"])
def test_s11_lowest_priority_lane_loses(mode: str) -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer(
        "b",
        mode=mode,
        capacity=3,
        key=KEY,
        lane=LANE,
        lane_priority={"urgent": 3, "normal": 2, "background": 1},
        on_drop=drops.append,
    )
    buf.ingest((1, "normal"))
    buf.ingest((2, "background"))
    buf.ingest((3, "urgent"))
    assert buf.ingest((4, "urgent")) is IngestResult.ENQUEUED
    assert [d.item for d in drops] == [(2, "background")]
    assert buf.ingest((5, "normal")) is IngestResult.ENQUEUED  # background empty: normal loses
    assert [d.item for d in drops] == [(2, "background"), (1, "normal")]
    assert drops[0].lane == "background" and drops[1].lane == "normal"
    assert drain_all(buf) == [(3, "urgent"), (4, "urgent"), (5, "normal")]


@pytest.mark.parametrize("mode", ["queue", "dedup_set", "latest_by_key"])
def test_s11_arrival_in_the_lowest_lane_is_itself_the_victim(mode: str) -> None:
    """A low-priority arrival cannot displace higher-priority work: its own lane loses."""
    buf = IngressBuffer("b", mode=mode, capacity=2, key=KEY, lane=LANE, lane_priority={"hi": 2})
    buf.ingest((1, "hi"))
    buf.ingest((2, "hi"))
    assert buf.ingest((3, "lo")) is IngestResult.DROPPED
    assert drain_all(buf) == [(1, "hi"), (2, "hi")]
    m = buf.metrics()
    assert m.lanes["lo"].dropped_total == 1
    assert m.enqueued_total == 3  # admitted, then lost the capacity contest


@pytest.mark.parametrize("mode", ["queue", "dedup_set", "latest_by_key"])
def test_s11_tied_lowest_lanes_rotate_round_robin_deterministically(mode: str) -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode=mode, capacity=6, key=KEY, lane=LANE, on_drop=drops.append)
    for i in range(6):
        buf.ingest((i, "xyz"[i % 3]))  # x: 0,3  y: 1,4  z: 2,5
    for i in range(6, 10):
        buf.ingest((i, "w"))  # a fourth lane, same priority, joins the rotation
    assert [d.lane for d in drops] == ["x", "y", "z", "w"]
    assert [d.item[0] for d in drops] == [0, 1, 2, 6]


def test_s11_round_robin_skips_empty_lanes() -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode="queue", capacity=2, lane=LANE, on_drop=drops.append)
    buf.ingest((0, "a"))
    buf.ingest((1, "b"))
    buf.ingest((2, "c"))  # a loses (first in rotation)
    buf.ingest((3, "c"))  # b loses next
    buf.ingest((4, "c"))  # a and b empty: c loses
    assert [d.lane for d in drops] == ["a", "b", "c"]


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
@pytest.mark.parametrize("ordering", ["none", "fifo"])
def test_s5_1_keyed_eviction_is_least_recently_seen_by_ingest_seq(mode: str, ordering: str) -> None:
    """Seed §5.1/§5.2: evict the key with the oldest lastSeen, tracked by ingestSeq, which
    every ingest attempt refreshes -- also with ordering="fifo", where the drain position
    stays at first enqueue."""
    drops: list[DropInfo] = []
    buf = IngressBuffer(
        "b", mode=mode, capacity=3, key=KEY, ordering=ordering, on_drop=drops.append
    )
    for k in ("a", "b", "c"):
        buf.ingest((k, 0))
    buf.ingest(("a", 1))  # a is now the most recently seen
    buf.ingest(("d", 0))
    assert [(d.reason, d.key) for d in drops] == [(DropReason.EVICT_LRU, "b")]
    buf.ingest(("c", 1))
    buf.ingest(("e", 0))
    assert [d.key for d in drops] == ["b", "a"]
    assert buf.metrics().dropped_by_reason == {"bad_key": 0, "evict_lru": 2}


def test_s11_ingest_seq_updates_on_every_ingest_attempt() -> None:
    buf = IngressBuffer("b", mode="dedup_set", capacity=4, key=KEY)
    buf.ingest(("a", 0))
    buf.ingest(("b", 0))
    m = buf.metrics()
    assert (m.ingest_seq_now, m.oldest_seq, m.newest_seq, m.seq_span) == (2, 1, 2, 1)
    buf.ingest(("a", 1))  # deduped, yet seen: a's last-seen moves to 3
    m = buf.metrics()
    assert (m.ingest_seq_now, m.oldest_seq, m.newest_seq, m.seq_span) == (3, 2, 3, 1)
    buf.ingest(("b", 1))
    m = buf.metrics()
    assert (m.ingest_seq_now, m.oldest_seq, m.newest_seq) == (4, 3, 4)


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
@pytest.mark.parametrize("ordering", ["none", "fifo"])
def test_s11_pending_key_reingested_with_another_lane_migrates(mode: str, ordering: str) -> None:
    buf = IngressBuffer(
        "b",
        mode=mode,
        capacity=4,
        key=KEY,
        lane=LANE,
        ordering=ordering,
        lane_priority={"urgent": 3},
    )
    buf.ingest(("k1", "world"))
    buf.ingest(("k2", "world"))
    expected = IngestResult.REPLACED if mode == "latest_by_key" else IngestResult.DEDUPED
    assert buf.ingest(("k2", "urgent")) is expected
    m = buf.metrics()
    assert m.lanes["world"].pending == 1
    assert m.lanes["urgent"].pending == 1
    assert m.migrated_total == 1
    assert buf.pending == 2
    out = drain_all(buf)
    # k2 now drains with urgent priority. dedup_set hands over the first item seen.
    assert [k for k, _ in out] == ["k2", "k1"]
    assert out[0] == (("k2", "urgent") if mode == "latest_by_key" else ("k2", "world"))


def test_s11_migrated_key_is_evicted_under_its_new_lane_priority() -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer(
        "b",
        mode="latest_by_key",
        capacity=2,
        key=KEY,
        lane=LANE,
        lane_priority={"hi": 2},
        on_drop=drops.append,
    )
    buf.ingest(("a", "lo"))
    buf.ingest(("b", "lo"))
    buf.ingest(("a", "hi"))  # a migrates to hi
    buf.ingest(("c", "lo"))  # lo loses: its only old key is b
    assert [d.key for d in drops] == ["b"]
    assert sorted(k for k, _ in drain_all(buf)) == ["a", "c"]


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key", "queue"])
def test_s11_key_none_is_bad_key_dropped_warned_and_hooked(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    drops: list[DropInfo] = []
    buf = IngressBuffer("b", mode=mode, capacity=4, key=KEY, lane=LANE, on_drop=drops.append)
    with caplog.at_level(logging.WARNING, logger="tensorpool.ingest"):
        assert buf.ingest((None, "x")) is IngestResult.DROPPED
    assert buf.pending == 0
    assert [(d.reason, d.key, d.lane) for d in drops] == [(DropReason.BAD_KEY, None, "x")]
    assert any("reason bad_key" in r.getMessage() for r in caplog.records)
    m = buf.metrics()
    assert m.dropped_by_reason["bad_key"] == 1
    assert (m.ingested_total, m.ingest_seq_now) == (0, 0)  # refused at the door
    assert buf.drain(1, lambda _: None).dropped == 1


def test_s11_unhashable_key_is_also_bad_key() -> None:
    buf = IngressBuffer("b", mode="dedup_set", capacity=4, key=lambda x: x)
    assert buf.ingest(["not", "hashable"]) is IngestResult.DROPPED
    laned = IngressBuffer("b", mode="dedup_set", capacity=4, key=lambda x: x, lane=lambda x: 1)
    assert laned.ingest({"a": 1}) is IngestResult.DROPPED
    assert buf.metrics().dropped_by_reason["bad_key"] == 1
    assert laned.metrics().dropped_by_reason["bad_key"] == 1
    assert laned.lanes == ()


def test_reentrant_ingest_from_handler_sees_exact_depth() -> None:
    """A handler re-queuing work into the same buffer must not trigger a phantom eviction."""
    buf = IngressBuffer("b", mode="queue", capacity=3)
    for x in (1, 2, 3):
        buf.ingest(x)
    seen: list[int] = []

    def handle(x: int) -> None:
        seen.append(x)
        if x == 1:
            buf.ingest(4)  # 2 pending + this one = 3: fits exactly

    stats = buf.drain(1, handle)
    assert (stats.processed, stats.pending, stats.dropped) == (1, 3, 0)
    assert drain_all(buf) == [2, 3, 4]
