"""Sans-IO planning of sparse (relay) streams and the budgeted descriptor intake.

A rate limiter or bridge keeps its source's seq numbers, so its output seqs have gaps. These
tests drive :class:`StreamPlanner` with ring states built slot by slot (exactly what a scan of
such a ring reads) and a descriptor feed over real :class:`~tensorpool.ingest.IngressBuffer` s,
one per stream, as the driver's attachment has. No Spark, no Aeron: they run in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tensorpool.ingest import DropInfo, IngressBuffer
from tensorpool.spark_source.plan.offsets import (
    Limits,
    Range,
    RingState,
    StreamPos,
    batch_ranges,
    iter_seq_chunks,
    runs_count,
    runs_seqs,
    split_ranges,
    to_runs,
)
from tensorpool.spark_source.plan.planner import StreamPlanner

E = 5  # the epoch of every ring here


def ring(nslots: int, published: Iterable[int], lens: int = 100) -> RingState:
    """The scan of a ring after a single writer published ``published`` in order."""
    slot_seq = np.full(nslots, -1, np.int64)
    for s in published:
        slot_seq[s & (nslots - 1)] = s
    return RingState.from_slots(E, slot_seq, slot_seq >= 0, np.full(nslots, lens, np.uint32))


class Feed:
    """The attachment's intake, minus Aeron: one drop-oldest IngressBuffer per stream."""

    def __init__(self, streams: Iterable[int], capacity: int = 1 << 16) -> None:
        self.spans: dict[int, dict[int, list[int]]] = {}
        self.buffers = {
            sid: IngressBuffer(
                f"t.{sid}",
                mode="queue",
                capacity=capacity,
                overflow="drop_oldest",
                on_drop=lambda info, sid=sid: self._dropped(sid, info),
            )
            for sid in streams
        }

    def _dropped(self, sid: int, info: DropInfo) -> None:
        epoch, seq = info.item
        span = self.spans.setdefault(sid, {}).setdefault(epoch, [seq, seq, 0])
        span[0], span[1], span[2] = min(span[0], seq), max(span[1], seq), span[2] + 1

    def publish(self, sid: int, seqs: Iterable[int]) -> None:
        for s in seqs:
            self.buffers[sid].ingest((E, s))

    def pending(self, sid: int) -> int:
        return self.buffers[sid].pending

    def take(self, sid: int, n: int):
        out: list[tuple[int, int]] = []
        self.buffers[sid].drain(n, out.append)
        drops = [(e, lo, hi, c) for e, (lo, hi, c) in self.spans.pop(sid, {}).items()]
        return out, drops


def started(nslots: int, sid: int = 1) -> StreamPlanner:
    """A planner whose query began (initial offset) on an empty ring at seq 0."""
    pl = StreamPlanner([sid])
    pl.begin(sid, ring(nslots, []), 0)
    return pl


def test_sparse_plan_spans_more_seqs_than_slots_without_false_loss():
    """A relay publishing every 10th seq into 64 slots: one batch covers seqs 0..300 (4.7x the
    ring) and plans exactly the 31 published frames, one run each, with no loss at all."""
    published = list(range(0, 301, 10))
    feed = Feed([1])
    feed.publish(1, published)
    pl = started(64)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: ring(64, published)}, Limits(), feed=feed)
    assert runs_seqs(plan.runs[1]).tolist() == published
    assert plan.end[1] == StreamPos(E, 301, 0, 0, 31)
    assert not plan.losses and not plan.possible
    assert feed.pending(1) == 0


def test_admission_counts_frames_not_seq_span():
    """issue 6 §4 admission control on a sparse stream: maxFramesPerTrigger=5 admits 5 frames
    (seq span 41), and maxBytesPerTrigger counts the bytes of those frames."""
    published = list(range(0, 301, 10))
    st = ring(64, published, lens=100)
    pl = started(64)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: st}, Limits(max_frames=5))
    assert runs_seqs(plan.runs[1]).tolist() == [0, 10, 20, 30, 40]
    assert plan.end[1] == StreamPos(E, 41, 0, 0, 5)
    plan = pl.plan({1: plan.end[1]}, {1: st}, Limits(max_bytes=350))  # 3 frames of 100 B
    assert runs_seqs(plan.runs[1]).tolist() == [50, 60, 70]
    assert plan.end[1] == StreamPos(E, 71, 0, 0, 8)
    # two streams share the budget by backlog in frames (31 vs 8), not by seq span
    dense = ring(64, range(100, 108))
    pl2 = StreamPlanner([1, 2])
    plan = pl2.plan(
        {1: StreamPos(E, 0), 2: StreamPos(E, 100)}, {1: st, 2: dense}, Limits(max_frames=13)
    )
    assert (plan.end[1].frames, plan.end[2].frames) == (10, 3)


def test_sparse_overrun_is_counted_in_frames():
    """Real loss on a sparse stream: 101 frames (every 10th seq) into 64 slots keep only the
    last 32; the 69 overwritten ones are counted exactly from the descriptors -- not the 690
    seqs they span -- and the batch plans the 32 still readable."""
    published = list(range(0, 1001, 10))
    feed = Feed([1])
    feed.publish(1, published)
    pl = started(64)
    st = ring(64, published)
    assert st.gapped
    plan = pl.plan({1: StreamPos(E, 0)}, {1: st}, Limits(), feed=feed)
    assert plan.end[1] == StreamPos(E, 1001, 69, 0, 32)
    (loss,) = plan.losses
    assert (loss.count, loss.first_seq, loss.last_seq) == (69, 0, 680)
    assert runs_seqs(plan.runs[1]).tolist() == published[69:]
    assert not plan.possible


def test_dense_stream_unchanged_one_run_and_exact_prefix_loss():
    """A normal producer: the plan is one run (the executors' vectorized path) and loss is the
    overwritten prefix, exact without any descriptor."""
    st = ring(16, range(100))
    assert not st.gapped and (st.oldest, st.head) == (84, 100)
    pl = StreamPlanner([1])
    plan = pl.plan({1: StreamPos(E, 0)}, {1: st}, Limits(max_frames=10))
    assert plan.runs[1].tolist() == [[84, 94]]
    assert plan.end[1] == StreamPos(E, 94, 84, 0, 10)
    assert (plan.losses[0].first_seq, plan.losses[0].last_seq) == (0, 83)


def test_unknown_loss_before_the_reader_attached_is_an_upper_bound_not_a_count():
    """A restarted reader has no descriptors for frames published while it was down: on a
    sparse stream it cannot tell which missing seqs were published. It reports a possible loss
    with an upper bound (never counted in 'lost', never failing the query) and reads what is
    there; a seq whose slot holds an older frame or none is provably never published."""
    published = list(range(0, 1001, 10))
    st = ring(64, published)
    pl = StreamPlanner([1])  # no begin(): the restart case
    plan = pl.plan({1: StreamPos(E, 0)}, {1: st}, Limits(), feed=Feed([1]))
    assert plan.end[1] == StreamPos(E, 1001, 0, 0, 32)
    assert not plan.losses
    (maybe,) = plan.possible
    assert maybe.count is None and maybe.at_most is not None
    # the bound covers the 69 real losses but not seqs whose slots hold older frames (odd seqs
    # never land in this ring's even slots)
    assert 69 <= maybe.at_most < 1001 - 32
    assert st.maybe_overwritten(1, 2) == (0, 1, 1)


def test_intake_budget_leaves_later_descriptors_pending():
    """issue 7 part 7 (bounded ingest): a trigger drains a stream's descriptor queue only as
    far as its planned range; with maxFramesPerTrigger=5 the 96 later descriptors stay queued
    and the next trigger takes the next 5."""
    published = list(range(0, 1001, 10))
    feed = Feed([1])
    feed.publish(1, published)
    st = ring(2048, published)
    pl = started(2048)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: st}, Limits(max_frames=5), feed=feed)
    assert plan.drained == {1: 5} and feed.pending(1) == 96
    plan = pl.plan({1: plan.end[1]}, {1: st}, Limits(max_frames=5), feed=feed)
    assert runs_seqs(plan.runs[1]).tolist() == [50, 60, 70, 80, 90]
    assert plan.drained == {1: 5} and feed.pending(1) == 91


def test_intake_budget_reaches_past_lost_frames_of_the_range():
    """When frames inside the planned range were lost, the drain goes on past the admitted
    count until the range's descriptors are in: the loss count stays exact in frames."""
    published = list(range(0, 1001, 10))  # 64 slots keep the last 32
    feed = Feed([1])
    feed.publish(1, published)
    pl = started(64)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: ring(64, published)}, Limits(max_frames=2), feed=feed)
    assert runs_seqs(plan.runs[1]).tolist() == [690, 700]
    assert plan.end[1] == StreamPos(E, 701, 69, 0, 2)
    assert plan.drained[1] >= 71 and feed.pending(1) == 101 - plan.drained[1]


def test_intake_overflow_is_reported_and_causes_no_false_loss():
    """issue 7 part 7: a full intake drops the oldest descriptors and counts them; where the
    record has that hole a sparse stream's loss is only bounded (possible), so overflow never
    invents counted loss; every readable frame is still planned (the ring is the authority)."""
    published = list(range(0, 58, 3))  # 20 frames, 16 slots keep the last 16
    feed = Feed([1], capacity=8)
    feed.publish(1, published)
    assert feed.pending(1) == 8
    pl = started(16)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: ring(16, published)}, Limits(), feed=feed)
    assert plan.dropped == {1: 12} and pl.intake_dropped == 12
    assert runs_seqs(plan.runs[1]).tolist() == published[4:]
    assert plan.end[1].lost == 0 and not plan.losses
    (maybe,) = plan.possible
    assert maybe.at_most is not None and maybe.at_most >= 4  # the 4 really lost are within


def test_sparse_epoch_change_counts_unread_frames_of_the_old_epoch():
    """issue 6 §4 epoch change on a relay stream: the unread rest of the old epoch is counted
    in frames from its descriptors (3 frames), not in seqs (21)."""
    published = [0, 10, 20, 30, 40]
    feed = Feed([1])
    feed.publish(1, published)
    pl = started(64)
    plan = pl.plan({1: StreamPos(E, 0)}, {1: ring(64, published[:2])}, Limits(), feed=feed)
    assert plan.end[1].seq == 11
    pl.observe(1, ring(64, published))  # the reader saw the old epoch reach seq 40
    new = RingState.from_slots(E + 1, np.full(8, -1, np.int64), np.zeros(8, bool))
    plan = pl.plan({1: plan.end[1]}, {1: new}, Limits(), feed=feed)
    assert plan.end[1].epoch == E + 1 and plan.end[1].lost == 3
    assert plan.losses[0].count == 3


def test_replay_definition_and_partition_split_by_frames():
    """issue 6 §5 replay: a batch is 'every frame committed in [start.seq, end.seq)' and
    end.frames - start.frames says how many; an offset written before 'frames' existed gives
    no count (read what is there). Partitions split by frames, not by seq span."""
    start, end = StreamPos(E, 0, 0, 0, 7), StreamPos(E, 301, 2, 0, 38)
    (r,) = batch_ranges({1: start}, {1: end})
    assert (r.first, r.end, r.expect) == (0, 301, 31)
    (r,) = batch_ranges({1: StreamPos(E, 0, 0, 0, None)}, {1: StreamPos(E, 9, 0, 0, None)})
    assert r.expect is None
    assert batch_ranges({1: start}, {1: StreamPos(E, 50, 5, 0, 7)}) == []  # all lost
    seqs = np.arange(0, 301, 10)
    runs = to_runs(seqs)
    pieces = split_ranges([Range(1, E, 0, 301, 31, runs)], 4)
    assert [runs_count(p.runs) for p in pieces] == [8, 8, 8, 7]
    assert np.concatenate([runs_seqs(p.runs) for p in pieces]).tolist() == seqs.tolist()
    assert all(p.first == p.runs[0, 0] and p.end == p.runs[-1, 1] for p in pieces)
    dense = split_ranges([Range(1, E, 10, 20, 10, to_runs(np.arange(10, 20)))], 3)
    assert [p.runs.tolist() for p in dense] == [[[10, 14]], [[14, 17]], [[17, 20]]]
    chunks = list(iter_seq_chunks(np.array([[0, 5], [7, 8], [9, 14]]), 4))
    assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 7, 9, 10], [11, 12, 13]]


def test_a_second_initial_offset_does_not_shrink_the_descriptor_record():
    """pyspark 4.3 calls initialOffset twice on a fresh query and logs the first result. The
    second call re-anchors the stream at a later head; the record must still cover everything
    since the first call (the attachment has been queueing descriptors since then), or frames
    lost between the two positions would be reported as a 'possible' loss of unknown size
    instead of an exact one -- the demo showed exactly that on its rate-limited stream."""
    feed = Feed([1])
    pl = StreamPlanner([1])
    early = list(range(0, 100, 10))
    pl.begin(1, ring(64, early), 100)  # first initialOffset: latest = 100
    later = list(range(100, 200, 10))  # 110..190 etc. published between the two calls
    feed.publish(1, later)
    pl.begin(1, ring(64, early + later), 200)  # second initialOffset, same epoch
    more = list(range(200, 1000, 10))  # wraps the 64-slot ring many times
    feed.publish(1, more)
    st = ring(64, early + later + more)
    plan = pl.plan({1: StreamPos(E, 100)}, {1: st}, Limits(), feed=feed)
    assert not plan.possible, plan.possible
    present = runs_seqs(plan.runs[1]).tolist()
    (loss,) = plan.losses
    assert loss.count == len(later) + len(more) - len(present)
