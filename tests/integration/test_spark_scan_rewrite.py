"""The Spark source's ring scan when the producer rewrites a slot while the scan runs.

The scan loads every ``seq_commit``, copies the slot records, loads ``seq_commit`` again; a
slot whose two loads differ is not committed. Its old frame is gone, so the plan must count it
lost: ``failOnDataLoss=false`` promises that every seq of a planned range is either delivered or
counted. Before the fix the scan reported the slot as still holding its old seq -- a frame
neither readable nor overwritten, missing from ``lost`` for good (the load-dependent failure of
test_fail_on_data_loss_false_skips_and_counts: its exact count never settled).

Real producer and SHM; only the moment of the producer's write is forced (between the scan's
two loads: a window of about a microsecond that a loaded host widens by preempting the scan).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from test_spark_ring_sparse import _layout

from tensorpool.spark_source.plan.offsets import Limits, StreamPos
from tensorpool.spark_source.plan.planner import StreamPlanner
from tensorpool.spark_source.rings.mapped_rings import MappedStream, RegionSpec


class _WriteDuringCopy:
    """The ring view's slot records, with one producer commit before the copy is taken."""

    def __init__(self, slots: np.ndarray, producer: Any, seq: int) -> None:
        self.slots, self.producer, self.seq = slots, producer, seq

    def __getitem__(self, idx: Any) -> np.ndarray:
        claim = self.producer.claim((4,), np.int64, seq=self.seq)
        assert claim is not None
        claim.array[:] = self.seq
        self.producer.commit(claim)
        return self.slots[idx]


def test_frame_overwritten_during_the_scan_is_counted_lost(media_driver, shm_base):
    """16 slots hold 24..39; seq 40 replaces 24 while the scan copies the slots. A plan from
    seq 20 admitting 6 frames reads 25..30 and counts 20..24 lost: every seq of [20, 31)."""
    ctx, producer, consumer, layout = _layout(media_driver, shm_base, list(range(40)), 16)
    m = MappedStream(RegionSpec.from_layout(layout), (shm_base,))
    try:
        view = m.ring
        view.slots = _WriteDuringCopy(view.slots, producer, 40)  # type: ignore[assignment]
        st = m.scan()
        view.slots = view.slots.slots  # type: ignore[attr-defined]
        assert (st.oldest, st.head, st.gapped) == (25, 40, False)
        planner = StreamPlanner([6])
        planner.begin(6, st, 20)
        plan = planner.plan({6: StreamPos(st.epoch, 20)}, {6: st}, Limits(max_frames=6))
        end = plan.end[6]
        assert plan.runs[6].tolist() == [[25, 31]]
        assert (end.seq, end.frames, end.lost) == (31, 6, 5)
        assert end.frames + end.lost == end.seq - 20, "a seq was neither read nor counted"
    finally:
        m.close()
        consumer.close()
        producer.close()
        ctx.close()
