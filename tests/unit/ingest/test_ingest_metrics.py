"""Issue #7 rule 4: the metrics contract (seed §9, §12) and metrics_reset."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import pytest

from tensorpool.ingest import (
    EMA_ALPHA,
    DrainStats,
    IngressBuffer,
    LaneMetrics,
    Mode,
    Ordering,
    Overflow,
)

KEY = itemgetter(0)
LANE = itemgetter(1)


def noop(_: Any) -> None:
    return None


def test_s12_identity_and_config_fields() -> None:
    m = IngressBuffer(
        "squares.load", mode="dedup_set", capacity=5000, key=KEY, ordering="fifo"
    ).metrics()
    assert (m.name, m.mode, m.capacity, m.ordering, m.overflow) == (
        "squares.load",
        Mode.DEDUP_SET,
        5000,
        Ordering.FIFO,
        None,
    )
    q = IngressBuffer("q", mode="queue", capacity=3, overflow="drop_newest").metrics()
    assert (q.ordering, q.overflow) == (None, Overflow.DROP_NEWEST)


def test_s12_empty_buffer_snapshot() -> None:
    m = IngressBuffer("b", mode="queue", capacity=3).metrics()
    assert (m.pending, m.peak_pending, m.ingest_seq_now) == (0, 0, 0)
    assert (m.oldest_seq, m.newest_seq, m.seq_span) == (None, None, 0)
    assert m.last_drain is None
    assert (m.avg_pending, m.avg_seq_span, m.ema_pending, m.ema_seq_span) == (None,) * 4
    assert m.lanes == {
        "default": LaneMetrics(
            priority=1,
            pending=0,
            peak_pending=0,
            drained_total=0,
            dropped_total=0,
            oldest_seq=None,
            newest_seq=None,
            seq_span=0,
        )
    }


def test_s12_totals_and_enqueued_counts_only_new_keys() -> None:
    buf = IngressBuffer("b", mode="latest_by_key", capacity=2, key=KEY)
    for item in [("a", 1), ("a", 2), ("b", 1), ("c", 1), (None, 0)]:
        buf.ingest(item)
    buf.drain(1, noop)
    buf.drain(0, noop)
    m = buf.metrics()
    assert m.ingested_total == 4  # bad_key is refused before it counts as ingested
    assert m.enqueued_total == 3  # a, b, c -- the replacement of a is not an enqueue
    assert (m.deduped_total, m.replaced_total) == (0, 1)
    assert (m.dropped_total, m.drained_total, m.drain_calls_total) == (2, 1, 2)
    assert m.dropped_by_reason == {"bad_key": 1, "evict_lru": 1}
    assert m.ingested_total == m.enqueued_total + m.deduped_total + m.replaced_total


def test_s12_dropped_by_reason_names_per_configuration() -> None:
    keyed = IngressBuffer("k", mode="dedup_set", capacity=1, key=KEY)
    assert set(keyed.metrics().dropped_by_reason) == {"bad_key", "evict_lru"}
    for policy, reason in [
        ("drop_oldest", "drop_oldest"),
        ("drop_newest", "drop_newest"),
        ("drop_buffer", "drop_buffer"),
        ("fail", "overflow"),
    ]:
        q = IngressBuffer("q", mode="queue", capacity=1, overflow=policy)
        assert set(q.metrics().dropped_by_reason) == {"bad_key", reason}


def test_s12_peak_pending_and_last_drain_snapshot() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=10)
    buf.ingest_many(range(6))
    stats = buf.drain(4, noop)
    buf.ingest(99)
    m = buf.metrics()
    assert (m.pending, m.peak_pending) == (3, 6)
    assert m.last_drain == stats == DrainStats(4, 2, 0, 0, None)
    assert m.last_drain.pending_after == 2


def test_s12_sequence_span_tracks_oldest_and_newest_pending() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=10, lane=LANE)
    for i, lane in enumerate("abab"):  # seqs 1..4
        buf.ingest((i, lane))
    m = buf.metrics()
    assert (m.ingest_seq_now, m.oldest_seq, m.newest_seq, m.seq_span) == (4, 1, 4, 3)
    assert (m.lanes["a"].oldest_seq, m.lanes["a"].newest_seq, m.lanes["a"].seq_span) == (1, 3, 2)
    assert m.lanes["b"].seq_span == 2
    buf.drain(2, noop)  # takes seq 1 (a) and 2 (b)
    m = buf.metrics()
    assert (m.oldest_seq, m.newest_seq, m.seq_span) == (3, 4, 1)


def test_s12_running_means_and_ema_are_sampled_after_each_drain() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=10)
    buf.ingest_many(range(4))  # seqs 1..4
    buf.drain(1, noop)  # pending 3 (seqs 2..4): span 2
    buf.drain(2, noop)  # pending 1: span 0
    m = buf.metrics()
    assert m.avg_pending == pytest.approx(2.0)
    assert m.avg_seq_span == pytest.approx(1.0)
    assert m.ema_pending == pytest.approx(3 + EMA_ALPHA * (1 - 3))
    assert m.ema_seq_span == pytest.approx(2 + EMA_ALPHA * (0 - 2))


def test_s12_per_lane_summaries() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=4, lane=LANE, lane_priority={"hi": 2})
    for item in [(1, "hi"), (2, "lo"), (3, "lo"), (4, "lo"), (5, "hi")]:
        buf.ingest(item)  # the fifth evicts lo's oldest
    buf.drain(3, noop)  # hi: 1, 5 then lo: 3
    lanes = buf.metrics().lanes
    assert list(lanes) == ["hi", "lo"]
    assert lanes["hi"] == LaneMetrics(2, 0, 2, 2, 0, None, None, 0)
    lo = lanes["lo"]
    assert (lo.priority, lo.pending, lo.peak_pending, lo.drained_total, lo.dropped_total) == (
        1,
        1,
        3,
        1,
        1,
    )
    assert (lo.oldest_seq, lo.newest_seq, lo.seq_span) == (4, 4, 0)


def test_s12_metrics_reset_restarts_counters_and_keeps_behaviour() -> None:
    """Seed §12: reset clears counters/peaks/averages; contents, ordering, lane queues and
    round-robin pointers stay, so the next drains and evictions are those of a twin that was
    never reset."""

    def make() -> IngressBuffer:
        return IngressBuffer("b", mode="queue", capacity=4, lane=LANE)

    reset, twin = make(), make()
    script = [(0, "a"), (1, "b"), (2, "c"), (3, "a"), (4, "b")]  # one eviction: a loses
    for buf in (reset, twin):
        for item in script:
            buf.ingest(item)
        buf.drain(1, noop)  # serves lane a first, pointer moves to b
    before = reset.metrics()
    reset.metrics_reset()
    m = reset.metrics()
    assert (m.ingested_total, m.enqueued_total, m.dropped_total, m.drained_total) == (0, 0, 0, 0)
    assert (m.drain_calls_total, m.replaced_total, m.deduped_total) == (0, 0, 0)
    assert set(m.dropped_by_reason.values()) == {0}
    assert m.peak_pending == m.pending == before.pending == 3
    assert (m.avg_pending, m.ema_pending) == (None, None)
    assert m.last_drain == before.last_drain  # a snapshot of the past, not a counter
    assert m.ingest_seq_now == before.ingest_seq_now  # the sequence is behaviour, not a metric
    assert all(lm.drained_total == lm.dropped_total == 0 for lm in m.lanes.values())
    assert {n: lm.pending for n, lm in m.lanes.items()} == {
        n: lm.pending for n, lm in before.lanes.items()
    }
    for buf in (reset, twin):
        buf.ingest((5, "c"))
        buf.ingest((6, "c"))  # eviction pointer continues: b loses next
    outs = []
    for buf in (reset, twin):
        out: list[Any] = []
        buf.drain(2, out.append)
        buf.drain(10, out.append)
        outs.append(out)
    assert outs[0] == outs[1]
    assert reset.metrics().dropped_by_reason == {"bad_key": 0, "drop_oldest": 1}
    assert reset.metrics().lanes["b"].dropped_total == 1
