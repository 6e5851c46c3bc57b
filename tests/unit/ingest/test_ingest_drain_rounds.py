"""Multi-lane round-robin drains whose handler changes the buffer mid-round (seed §7, §8.3,
§12): the batched round-robin path must keep the same order and exact counts as a
round-by-round loop -- lanes emptied or refilled under it, handler errors, the lane that opens
the next drain."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import IngressBuffer

NAME = itemgetter(0)
LANE = itemgetter(1)


def noop(_: Any) -> None:
    return None


def three_lanes(per_lane: int, **kw: Any) -> IngressBuffer:
    """Lanes a, b, c of priority 1 with ``per_lane`` items each, ingested interleaved, full;
    lane "late" (priority 2) is first seen inside a handler."""
    buf = IngressBuffer(
        "rr",
        capacity=3 * per_lane,
        lane=LANE,
        lane_priority={"late": 2},
        **kw,
    )
    for i in range(1, per_lane + 1):
        for lane in "abc":
            buf.ingest((f"{lane}{i}", lane))
    return buf


def script(buf: IngressBuffer, at: dict[str, list[tuple[str, str]]]) -> Callable[[Any], None]:
    """Handler recording names; after item ``name`` it ingests ``at[name]`` into ``buf``."""
    seen: list[str] = []

    def handle(item: tuple[str, str]) -> None:
        seen.append(item[0])
        for extra in at.get(item[0], ()):
            buf.ingest(extra)

    handle.seen = seen  # type: ignore[attr-defined]
    return handle


def late(n: int, prefix: str = "x") -> list[tuple[str, str]]:
    return [(f"{prefix}{i}", "late") for i in range(n)]


def drained_by_lane(buf: IngressBuffer) -> dict[Any, int]:
    return {name: lm.drained_total for name, lm in buf.metrics().lanes.items()}


def test_s7_lane_emptied_by_the_handler_mid_round_is_skipped_and_counted_exactly() -> None:
    """a2's handler fills the buffer, then two overflowing ingests drop lane a, then lane b
    (drop_buffer, losers rotate): b is found empty on its visit in the same round."""
    buf = three_lanes(3, mode="queue", overflow="drop_buffer")
    handle = script(buf, {"a2": late(6)})
    stats = buf.drain(9, handle)
    assert handle.seen == ["a1", "b1", "c1", "a2", "c2", "c3"]  # type: ignore[attr-defined]
    assert (stats.processed, stats.pending, stats.dropped) == (6, 6, 3)
    assert drained_by_lane(buf) == {"a": 2, "b": 1, "c": 3, "late": 0}
    m = buf.metrics()
    assert (m.drained_total, m.pending, m.dropped_by_reason["drop_buffer"]) == (6, 6, 3)


def test_s7_next_drain_opens_after_the_last_lane_that_handed_out_an_item() -> None:
    """a2's handler drops lanes a, b and c (drop_buffer; 4 ingests fill, 4 overflow), so the
    round's last visits find b and c empty: the rotation continues after a, the last lane that
    actually handed out an item."""
    buf = three_lanes(3, mode="queue", overflow="drop_buffer")
    handle = script(buf, {"a2": late(8)})
    assert buf.drain(9, handle).processed == 4
    assert handle.seen == ["a1", "b1", "c1", "a2"]  # type: ignore[attr-defined]
    assert buf.drain(100, noop).processed == 8  # the "late" lane, now the top priority
    for lane in "abc":
        buf.ingest((f"{lane}9", lane))
    order: list[str] = []
    buf.drain(3, lambda it: order.append(it[0]))
    assert order == ["b9", "c9", "a9"]


def test_s7_lane_emptied_at_the_end_of_a_round_stays_out_of_that_drain() -> None:
    """a2's handler drops lanes a and b; b is still empty when the round ends, so it leaves the
    rotation. c3's handler refills b, but this drain does not visit b again -- the next does."""
    buf = three_lanes(4, mode="queue", overflow="drop_buffer")
    handle = script(buf, {"a2": late(7), "c3": [("b7", "b")]})
    buf.drain(100, handle)
    assert handle.seen == ["a1", "b1", "c1", "a2", "c2", "c3", "c4"]  # type: ignore[attr-defined]
    assert buf.lane_pending("b") == 1
    out: list[str] = []
    buf.drain(100, lambda it: out.append(it[0]))
    assert out == [*(f"x{i}" for i in range(7)), "b7"]


@pytest.mark.parametrize(
    ("mode", "ordering"),
    [
        ("queue", None),
        ("dedup_set", "none"),
        ("dedup_set", "fifo"),
        ("latest_by_key", "none"),
        ("latest_by_key", "fifo"),
    ],
)
def test_s12_handler_error_mid_round_counts_the_item_and_keeps_the_rotation(
    mode: str, ordering: str | None
) -> None:
    kw: dict[str, Any] = {"mode": mode}
    if mode != "queue":
        kw.update(key=NAME, ordering=ordering)
    buf = three_lanes(4, **kw)
    seen: list[str] = []

    def boom(item: tuple[str, str]) -> None:
        seen.append(item[0])
        if item[0] == "b3":
            raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        buf.drain(12, boom)
    assert seen == ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3"]
    assert drained_by_lane(buf) == {"a": 3, "b": 3, "c": 2}
    m = buf.metrics()
    assert (m.drained_total, m.pending) == (8, 4)
    rest: list[str] = []
    assert buf.drain(12, lambda it: rest.append(it[0])).processed == 4
    assert rest == ["c3", "a4", "b4", "c4"]  # the rotation resumes after b


@pytest.mark.parametrize("mode", ["dedup_set", "latest_by_key"])
@pytest.mark.parametrize("ordering", ["none", "fifo"])
def test_s5_eviction_by_the_handler_empties_keyed_lanes_mid_round(mode: str, ordering: str) -> None:
    """Keyed modes: a2's handler fills the buffer, then each overflowing ingest evicts the LRU
    key of the losing lane (losers rotate; a is empty by then): b2, then c2. Both visits that
    follow in the round find their lane empty; counts stay exact and the next drain opens
    after a."""
    buf = three_lanes(2, mode=mode, key=NAME, ordering=ordering)
    handle = script(buf, {"a2": late(6, "y")})
    stats = buf.drain(6, handle)
    assert handle.seen == ["a1", "b1", "c1", "a2"]  # type: ignore[attr-defined]
    assert (stats.processed, stats.pending, stats.dropped) == (4, 6, 2)
    assert drained_by_lane(buf) == {"a": 2, "b": 1, "c": 1, "late": 0}
    m = buf.metrics()
    assert (m.drained_total, m.dropped_by_reason["evict_lru"]) == (4, 2)
    assert buf.drain(100, noop).processed == 6
    for lane in "abc":
        buf.ingest((f"{lane}9", lane))
    order: list[str] = []
    buf.drain(3, lambda it: order.append(it[0]))
    assert order == ["b9", "c9", "a9"]
