"""DropCounters: stable reason names, cheap increments, snapshots (§15.4 accounting)."""

from __future__ import annotations

from tensorpool.counters import ALL_REASONS, LATE_REASONS, DropCounters, Reason


def test_reason_names_are_unique_snake_case_strings() -> None:
    assert len(ALL_REASONS) == len(set(ALL_REASONS))
    for name in ALL_REASONS:
        assert name == name.lower() and " " not in name
    assert Reason.HEADER_INDEX_OUT_OF_RANGE == "header_index_out_of_range"
    assert Reason.NO_POOL_FITS == "no_pool_fits"


def test_increment_snapshot_total() -> None:
    c = DropCounters()
    assert c.total() == 0 and c.snapshot() == {}
    c.increment(Reason.TORN_READ)
    c.increment(Reason.TORN_READ)
    c.increment(Reason.NO_POOL_FITS, 3)
    assert c[Reason.TORN_READ] == 2
    assert c.get(Reason.NO_POOL_FITS) == 3
    assert c.snapshot() == {Reason.TORN_READ: 2, Reason.NO_POOL_FITS: 3}
    assert c.total() == 5
    snap = c.snapshot()
    c.increment(Reason.TORN_READ)
    assert snap[Reason.TORN_READ] == 2, "snapshot must be a copy"


def test_unknown_reason_is_accepted_and_counted() -> None:
    c = DropCounters()
    c.increment("bad_epoch")
    assert c["bad_epoch"] == 1 and c.total() == 1


def test_s15_4_late_reasons_group_sums_to_drops_late() -> None:
    """§15.4: seq_commit instability (not committed, reused, torn) is reported as drops_late."""
    c = DropCounters()
    c.increment(Reason.NOT_COMMITTED)
    c.increment(Reason.SEQ_MISMATCH, 2)
    c.increment(Reason.TORN_READ, 4)
    c.increment(Reason.DTYPE_UNKNOWN)
    assert c.sum_of(LATE_REASONS) == 7
    c.reset()
    assert c.total() == 0
