"""SeqTracker: Wire Spec §15.4 gap accounting, §15.2 seq regression, max_outstanding_seq_gap."""

import pytest

from tensorpool.client.sequence import SeqTracker, SeqVerdict


def test_s15_4_gaps_in_seq_count_as_drops_gap() -> None:
    t = SeqTracker()
    assert t.on_descriptor(10) is SeqVerdict.READ  # first after map: no gap
    assert t.on_descriptor(11) is SeqVerdict.READ
    assert t.on_descriptor(15) is SeqVerdict.READ
    assert t.drops_gap == 3


def test_s15_2_seq_regression_requires_remap() -> None:
    t = SeqTracker()
    t.on_descriptor(5)
    assert t.on_descriptor(5) is SeqVerdict.REGRESSION
    assert t.on_descriptor(3) is SeqVerdict.REGRESSION
    t.reset()
    assert t.on_descriptor(0) is SeqVerdict.READ


def test_s15_4_max_outstanding_seq_gap_resyncs_by_skipping() -> None:
    t = SeqTracker(max_outstanding_seq_gap=4)
    t.on_descriptor(0)
    t.observe_head(100)  # e.g. the slot for seq 1 already holds seq 100
    assert t.on_descriptor(1) is SeqVerdict.RESYNC_SKIP
    assert t.on_descriptor(95) is SeqVerdict.RESYNC_SKIP
    assert t.on_descriptor(96) is SeqVerdict.READ  # within 4 of the head again
    assert t.resyncs == 2
    assert t.drops_gap == 93 + 2  # 2..94 never seen, plus the two skipped


def test_max_outstanding_seq_gap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SeqTracker(0)
