"""#27.2: the pulse reader feeds the frames of the ring port's scan (:class:`RingState`,
newest seq per slot) through :meth:`StreamScan.from_state`; it must select exactly the slots its
own scan selected before -- committed and intact across the seqlock scan -- with their stamps.

The scans are real :class:`~tensorpool.shm.ring.RingScan` values turned into ring states by the
production path (:func:`~tensorpool.spark_source.rings.mapped_rings.ring_state`); their two
``seq_commit`` loads are given by hand, since a producer rewriting a slot between the two loads
(a torn slot) cannot be produced deterministically otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorpool.shm.ring import SLOT_DTYPE, RingScan
from tensorpool.spark_source.plan.pulse import StreamScan
from tensorpool.spark_source.rings.mapped_rings import ring_state


def _committed_intact(scan: RingScan, epoch: int, nslots: int) -> StreamScan:
    """The selection the pulse reader's own scan made before #27.2 (the reference): slots
    whose commit word is set and equal across the scan, with their fields' stamps."""
    ok = scan.committed
    seqs = scan.seq[ok]
    ts = scan.fields["timestamp_ns"][ok].astype(np.int64)
    order = np.argsort(seqs, kind="stable")
    seqs, ts = seqs[order], ts[order]
    head = int(seqs[-1]) + 1 if seqs.size else 0
    return StreamScan(epoch, nslots, seqs, ts, head)


def _ring(rng: np.random.Generator, nslots: int, head: int, kinds: np.ndarray) -> RingScan:
    """A ring whose slot ``i`` last held seq ``s`` (the newest below ``head`` at ``i``), in one of
    the states ``kinds[i]``: 0 committed, 1 being written, 2 rewritten during the scan (torn),
    3 never written, 4 a relay's gap (the slot still holds an older seq, or none)."""
    idx = np.arange(nslots, dtype=np.intp)
    seq = head - 1 - ((head - 1 - idx) % nslots)
    w1 = np.zeros(nslots, np.uint64)
    w2 = np.zeros(nslots, np.uint64)
    for i in range(nslots):
        s = int(seq[i])
        kind = int(kinds[i])
        if s < 0 or kind == 3:
            continue
        if kind == 4:
            s -= nslots
            if s < 0:
                continue
        word = (s << 1) | 1
        if kind == 1:
            word = s << 1
        w1[i] = word
        w2[i] = ((s + nslots) << 1) | 1 if kind == 2 else word
    fields = np.zeros(nslots, SLOT_DTYPE)
    fields["timestamp_ns"] = rng.integers(1, 2**62, nslots, dtype=np.uint64)
    fields["values_len"] = rng.integers(0, 4096, nslots, dtype=np.uint32)
    return RingScan(idx, w1, w2, fields)


@pytest.mark.parametrize("nslots", [1, 8, 64])
def test_pulse_scan_from_ring_state_selects_the_committed_intact_slots(nslots: int) -> None:
    """#27.2 (pulse reader on the RingSource port): for rings with committed, in-progress,
    torn, empty and relay-gap slots, before and after wrapping, the frames (seqs, stamps) and
    head the pulse planner is fed are those of the committed, intact slots."""
    rng = np.random.default_rng(27 + nslots)
    cases = 0
    for head in (0, 1, nslots // 2 + 1, nslots, 3 * nslots + 5):
        for p_bad in (0.0, 0.3, 0.9):
            for _ in range(20):
                weights = [1 - p_bad, p_bad / 4, p_bad / 4, p_bad / 4, p_bad / 4]
                kinds = rng.choice(5, nslots, p=weights)
                scan = _ring(rng, nslots, head, kinds)
                want = _committed_intact(scan, 7, nslots)
                got = StreamScan.from_state(ring_state(7, scan))
                assert (got.epoch, got.nslots, got.head) == (want.epoch, want.nslots, want.head)
                np.testing.assert_array_equal(got.seqs, want.seqs)
                np.testing.assert_array_equal(got.timestamps, want.timestamps)
                assert got.seqs.dtype == got.timestamps.dtype == np.int64
                cases += 1
    assert cases == 5 * 3 * 20


def test_pulse_scan_of_a_ring_state_without_stamps_is_refused() -> None:
    """A hand-made RingState (no scan) has no stamps to cut windows by: a clear error."""
    from tensorpool.spark_source.plan.offsets import RingState

    with pytest.raises(ValueError, match="no timestamps"):
        StreamScan.from_state(RingState(3, 0, 4, 8))
