"""Descriptor sequence accounting for one mapped epoch (Wire Spec §15.2, §15.4).

The ring is lossy by design, so the consumer's job is to say honestly what it
missed: a jump in `FrameDescriptor.seq` is `drops_gap` (frames never seen), a
slot that was overwritten or in flight when read is `drops_late` (counted by the
reader). A regression of `seq` inside one epoch means the stream was recreated
under us and forces a remap (§15.2).

`max_outstanding_seq_gap` (§15.4, default 256): when the consumer is so far
behind the producer's head that the frames it is about to read are surely
overwritten, it resyncs by discarding queued descriptors without touching SHM
until it is within the window again. Those are counted as gaps too, and
separately as `resync` so QoS can show why.
"""

from __future__ import annotations

import enum

DEFAULT_MAX_OUTSTANDING_SEQ_GAP = 256


class SeqVerdict(enum.IntEnum):
    READ = 0
    RESYNC_SKIP = 1
    REGRESSION = 2


class SeqTracker:
    __slots__ = ("drops_gap", "head_seq", "last_seq", "max_gap", "resyncs")

    def __init__(self, max_outstanding_seq_gap: int = DEFAULT_MAX_OUTSTANDING_SEQ_GAP) -> None:
        if max_outstanding_seq_gap < 1:
            raise ValueError("max_outstanding_seq_gap must be >= 1")
        self.max_gap = max_outstanding_seq_gap
        self.last_seq = -1
        self.head_seq = -1
        self.drops_gap = 0
        self.resyncs = 0

    def reset(self) -> None:
        """Forget sequence state at an epoch boundary; counters keep running."""
        self.last_seq = -1
        self.head_seq = -1

    def observe_head(self, seq: int) -> None:
        """Learn that the producer has reached at least `seq` (overwritten slot, QoS)."""
        if seq > self.head_seq:
            self.head_seq = seq

    def on_descriptor(self, seq: int) -> SeqVerdict:
        last = self.last_seq
        if last >= 0:
            if seq <= last:
                return SeqVerdict.REGRESSION
            if seq > last + 1:
                self.drops_gap += seq - last - 1
        self.last_seq = seq
        if seq > self.head_seq:
            self.head_seq = seq
        elif self.head_seq - seq > self.max_gap:
            self.drops_gap += 1
            self.resyncs += 1
            return SeqVerdict.RESYNC_SKIP
        return SeqVerdict.READ
