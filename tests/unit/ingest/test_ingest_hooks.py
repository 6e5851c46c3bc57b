"""Issue #7 rule 5: hooks and their payloads (seed §9, §10.1, §11)."""

from __future__ import annotations

import logging
from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import (
    DrainStartInfo,
    DrainStats,
    DropInfo,
    DropReason,
    IngressBuffer,
    ReplaceInfo,
)

KEY = itemgetter(0)
LANE = itemgetter(1)


def noop(_: Any) -> None:
    return None


def test_s10_on_drain_start_payload(clock_factory: Any) -> None:
    seen: list[DrainStartInfo] = []
    buf = IngressBuffer("b", mode="queue", capacity=4, on_drain_start=seen.append)
    buf.ingest(1)
    buf.drain(3, noop)
    buf.drain(2, noop, max_millis=7.5, now_millis=clock_factory(start=42.0))
    assert seen == [DrainStartInfo(None, 3, None), DrainStartInfo(42.0, 2, 7.5)]


def test_s10_on_drain_end_receives_the_returned_stats() -> None:
    seen: list[DrainStats] = []
    buf = IngressBuffer("b", mode="latest_by_key", capacity=4, key=KEY, on_drain_end=seen.append)
    buf.ingest(("a", 1))
    buf.ingest(("a", 2))
    stats = buf.drain(5, noop)
    assert seen == [stats]
    assert (stats.processed, stats.pending, stats.dropped, stats.replaced) == (1, 0, 0, 1)


def test_s10_on_drop_payload_reason_item_key_lane() -> None:
    drops: list[DropInfo] = []
    keyed = IngressBuffer(
        "k", mode="dedup_set", capacity=1, key=KEY, lane=LANE, on_drop=drops.append
    )
    keyed.ingest(("a", "l1"))
    keyed.ingest(("b", "l2"))  # l1 loses (first in the rotation): a is evicted
    keyed.ingest((None, "l3"))
    assert drops == [
        DropInfo(DropReason.EVICT_LRU, ("a", "l1"), "a", "l1"),
        DropInfo(DropReason.BAD_KEY, (None, "l3"), None, "l3"),
    ]
    drops.clear()
    queue = IngressBuffer("q", mode="queue", capacity=1, on_drop=drops.append)
    queue.ingest("x")
    queue.ingest("y")
    assert drops == [DropInfo(DropReason.DROP_OLDEST, "x", None, "default")]
    drops.clear()
    with_key = IngressBuffer("q", mode="queue", capacity=1, key=KEY, on_drop=drops.append)
    with_key.ingest(("k1", 0))
    with_key.ingest(("k2", 0))
    assert drops == [DropInfo(DropReason.DROP_OLDEST, ("k1", 0), "k1", "default")]


def test_s10_on_replace_payload_old_new_key_lane() -> None:
    seen: list[ReplaceInfo] = []
    buf = IngressBuffer(
        "b", mode="latest_by_key", capacity=4, key=KEY, lane=LANE, on_replace=seen.append
    )
    buf.ingest(("hp", "world", 100))
    buf.ingest(("hp", "combat", 90))  # replaced and migrated
    assert seen == [ReplaceInfo(("hp", "world", 100), ("hp", "combat", 90), "hp", "combat")]
    single = IngressBuffer("s", mode="latest_by_key", capacity=4, key=KEY, on_replace=seen.append)
    single.ingest(("k", 1))
    single.ingest(("k", 2))
    assert seen[-1] == ReplaceInfo(("k", 1), ("k", 2), "k", "default")
    dedup = IngressBuffer("d", mode="dedup_set", capacity=4, key=KEY, on_replace=seen.append)
    dedup.ingest(("k", 1))
    dedup.ingest(("k", 2))
    assert len(seen) == 2  # dedup_set never replaces


@pytest.mark.parametrize("hook", ["on_drain_start", "on_drain_end", "on_drop", "on_replace"])
def test_s10_hook_exception_is_logged_and_does_not_corrupt_the_buffer(
    hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: Any) -> None:
        raise ValueError("hook bug")

    buf = IngressBuffer("b", mode="latest_by_key", capacity=2, key=KEY, **{hook: broken})
    with caplog.at_level(logging.ERROR, logger="tensorpool.ingest"):
        buf.ingest(("a", 1))
        buf.ingest(("a", 2))  # on_replace
        buf.ingest(("b", 1))
        buf.ingest(("c", 1))  # on_drop (evicts a)
        out: list[Any] = []
        stats = buf.drain(10, out.append)  # on_drain_start / on_drain_end
    assert sorted(out) == [("b", 1), ("c", 1)]
    assert (stats.processed, stats.pending, stats.dropped, stats.replaced) == (2, 0, 1, 1)
    m = buf.metrics()
    assert m.hook_errors_total == 1
    assert (m.ingested_total, m.enqueued_total, m.drained_total) == (4, 3, 2)
    errors = [r for r in caplog.records if f"{hook} hook raised" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None
    buf.ingest(("d", 1))
    assert buf.drain(10, noop).processed == 1


def test_s10_hooks_run_when_the_buffer_is_consistent() -> None:
    """A drop hook may look at (or ingest into) the buffer: it already sees the final state."""
    observed: list[tuple[int, int]] = []
    buf: IngressBuffer

    def on_drop(info: DropInfo) -> None:
        observed.append((buf.pending, buf.metrics().dropped_total))

    buf = IngressBuffer("b", mode="queue", capacity=2, on_drop=on_drop)
    for x in range(3):
        buf.ingest(x)
    assert observed == [(2, 1)]
