"""The soak's accounting ledger (issue #30 point 3): every seq delivered or counted."""

from __future__ import annotations

import json
from pathlib import Path

from tensorpool.client import consumer_core
from tensorpool.client.announce import CLOCK_MONOTONIC
from tensorpool.client.consumer_core import CHECK, READ, ConsumerCore, MapEpoch
from tensorpool.commands.soak import spark_batches
from tensorpool.counters import Reason
from tensorpool.soak.ledger import (
    DESCRIPTOR_REASONS,
    REVOKED,
    UNREPORTED_AT_STOP,
    Published,
    Segment,
    SparkBatch,
    check_bridge,
    check_rate_limit,
    reconcile,
    spark_segments,
)
from tensorpool.specs.generated import wire

SEC = 1_000_000_000
STREAM = 7


def test_30_3_every_seq_delivered_or_counted_balances() -> None:
    pub = [Published(STREAM, 1, 0, 99)]
    segs = [
        Segment("c", STREAM, 1, 10, 99, delivered=80, drops_gap=6, drops={"seq_mismatch": 4}),
    ]
    res = reconcile(pub, segs)
    assert res.unaccounted_frames == 0 and res.delivered == 80
    assert res.dropped == {"drops_gap": 6, "seq_mismatch": 4}
    assert res.tail == 0


def test_30_3_a_missing_seq_is_unaccounted_with_stream_epoch_and_range() -> None:
    """One seq neither delivered nor counted fails the run and names where it was."""
    segs = [Segment("c", STREAM, 3, 0, 49, delivered=45, drops_gap=4)]
    res = reconcile([Published(STREAM, 3, 0, 60)], segs)
    assert res.unaccounted_frames == 1
    (u,) = res.unaccounted
    assert (u.consumer, u.stream_id, u.epoch, u.first_seq, u.last_seq) == ("c", STREAM, 3, 0, 49)
    assert res.tail == 11  # 50..60: published after the consumer's last seq, not a loss


def test_30_3_descriptor_level_drops_do_not_balance_a_missing_seq() -> None:
    segs = [Segment("c", STREAM, 1, 0, 9, delivered=9, drops={"seq_stale": 1, "not_mapped": 3})]
    assert reconcile([Published(STREAM, 1, 0, 9)], segs).unaccounted_frames == 1


def test_30_3_a_seq_the_producer_never_published_is_unaccounted_when_its_report_is_complete() -> (
    None
):
    segs = [Segment("c", STREAM, 1, 0, 12, delivered=13)]
    res = reconcile([Published(STREAM, 1, 0, 9)], segs)
    assert [(u.first_seq, u.last_seq, u.frames) for u in res.unaccounted] == [(10, 12, 3)]
    # a killed producer's last progress line may be short: only the hole rule applies
    res = reconcile([Published(STREAM, 1, 0, 9, complete=False)], segs)
    assert res.unaccounted_frames == 0 and res.unverified_segments == 1


def test_30_3_descriptor_reasons_are_the_consumer_core_names() -> None:
    names = {getattr(consumer_core, n) for n in dir(consumer_core) if n.isupper()}
    assert names >= DESCRIPTOR_REASONS


def test_30_3_rate_limiter_and_bridge_rules() -> None:
    assert check_rate_limit([(101, 10.0)], max_rate_hz=10) == 0
    assert check_rate_limit([(150, 10.0)], max_rate_hz=10) == 49
    # each run of a restarted limiter may send at once; a run is judged by its own time
    assert check_rate_limit([(51, 5.0), (51, 5.0)], max_rate_hz=10) == 0
    assert check_rate_limit([(102, 5.0), (10, 5.0)], max_rate_hz=10) == 51
    assert check_bridge(source_published=100, dest_delivered=100) == 0
    assert check_bridge(source_published=100, dest_delivered=101) == 1


# --- the consumer core's per-mapping records feed the ledger -----------------------------------
def _announce(epoch: int) -> wire.ShmPoolAnnounceDecoder:
    buf = bytearray(4096)
    wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=STREAM,
        producer_id=1,
        epoch=epoch,
        announce_timestamp_ns=100 * SEC,
        announce_clock_domain=CLOCK_MONOTONIC,
        layout_version=1,
        header_nslots=64,
        header_slot_bytes=256,
        payload_pools=[(1, 64, 4096, "shm:file?path=/dev/shm/tp/x/payload-1.pool")],
        header_region_uri="shm:file?path=/dev/shm/tp/x/header.ring",
    )
    return wire.ShmPoolAnnounceDecoder().wrap(buf)


def _map(core: ConsumerCore, epoch: int, head: int = -1) -> None:
    action = core.on_announce(_announce(epoch), None, 100 * SEC)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, head, 100 * SEC)


def _take(core: ConsumerCore, seq: int, *, late: bool = False) -> None:
    """One descriptor; a READ is delivered (the agent counts the frame) or read late."""
    v = core.on_descriptor(STREAM, core.epoch, seq, 100 * SEC)
    if v == CHECK:
        v = core.on_slot_check(seq, seq, core.last_seq, 100 * SEC)
    if v == READ:
        if late:
            core.drops.increment(Reason.SEQ_MISMATCH)
        else:
            core.stats.frames += 1


def test_30_3_consumer_core_segments_balance_through_gaps_late_reads_and_remaps() -> None:
    core = ConsumerCore(
        STREAM, 11, freshness_ns=3 * SEC, qos_period_ns=SEC, realtime_clock=lambda: SEC
    )
    _map(core, 1)
    for seq in (3, 4, 5, 9, 10):  # join at 3, a gap of 3 (6..8)
        _take(core, seq)
    _take(core, 11, late=True)
    core.on_descriptor(STREAM, 0, 12, 100 * SEC)  # another epoch's: descriptor-level
    _map(core, 2)
    for seq in range(0, 5):
        _take(core, seq)
    records = core.segment_records()
    assert [(r["epoch"], r["first_seq"], r["last_seq"], r["delivered"]) for r in records] == [
        (1, 3, 11, 5),
        (2, 0, 4, 5),
    ]
    segs = [Segment("c", STREAM, **r) for r in records]  # type: ignore[arg-type]
    pub = [Published(STREAM, 1, 0, 11), Published(STREAM, 2, 0, 4)]
    assert reconcile(pub, segs).unaccounted_frames == 0


def _batch(
    bid: int,
    start: tuple[int, int, int, int],
    end: tuple[int, int, int, int],
    rows: dict,
    run: str = "",
) -> SparkBatch:
    return SparkBatch(bid, STREAM, *start, *end, rows, run)


def test_30_3_spark_rows_plus_reported_loss_equal_what_was_published_in_its_range() -> None:
    """Spark batches [0,100) and [100,200) of epoch 2: batch 1 lost 5 at planning (its own
    ``lost``) and 3 at reading (``lostLate`` grows in the next batch's offset); rows + loss
    balance every range, so nothing is unaccounted."""
    batches = [
        _batch(0, (2, 0, 0, 0), (2, 100, 0, 0), {2: (100, 100, 0, 99)}),
        _batch(1, (2, 100, 0, 0), (2, 200, 5, 0), {2: (92, 92, 100, 199)}),
        _batch(2, (2, 200, 5, 0), (2, 250, 5, 3), {2: (50, 50, 200, 249)}),
    ]
    segs, odd, across = spark_segments(batches)
    res = reconcile([Published(STREAM, 2, 0, 300)], segs)
    assert (res.unaccounted_frames, odd, across) == (0, [], 0)
    assert res.delivered == 242 and res.dropped == {"spark_lost": 5, "spark_lost_late": 3}


def test_30_3_a_seq_spark_neither_read_nor_counted_is_unaccounted_with_its_range() -> None:
    batches = [
        _batch(0, (2, 0, 0, 0), (2, 100, 2, 0), {2: (97, 97, 0, 99)}),
        _batch(1, (2, 100, 2, 0), (2, 150, 2, 0), {2: (50, 50, 100, 149)}),
    ]
    segs, _odd, _ = spark_segments(batches)
    res = reconcile([Published(STREAM, 2, 0, 200)], segs)
    assert res.unaccounted_frames == 1
    (u,) = res.unaccounted
    assert (u.consumer, u.stream_id, u.epoch, u.first_seq, u.last_seq) == (
        "spark#0",
        STREAM,
        2,
        0,
        99,
    )


def test_30_3_spark_rows_never_published_duplicated_or_outside_the_batch_are_unaccounted() -> None:
    segs, odd, _ = spark_segments([_batch(0, (2, 0, 0, 0), (2, 100, 0, 0), {2: (100, 100, 0, 99)})])
    res = reconcile([Published(STREAM, 2, 0, 49)], segs)  # the producer stopped at 49
    assert res.unaccounted_frames == 50 and res.unaccounted[0].why == "taken but never published"
    _segs, odd, _ = spark_segments(
        [_batch(0, (2, 0, 0, 0), (2, 100, 0, 0), {2: (101, 100, 0, 100)})]
    )
    assert [u.why.split(" (")[0] for u in odd] == [
        "duplicate rows",
        "rows outside the batch's range",
    ]


def test_30_3_a_replayed_spark_batch_counts_once_and_epoch_crossings_are_counted_apart() -> None:
    first = _batch(0, (2, 0, 0, 0), (2, 100, 0, 0), {2: (40, 40, 0, 39)})  # cut by a kill
    replay = _batch(0, (2, 0, 0, 0), (2, 100, 0, 0), {2: (100, 100, 0, 99)})
    cross = _batch(1, (2, 100, 0, 0), (3, 10, 4, 0), {2: (4, 4, 100, 103), 3: (10, 10, 0, 9)})
    segs, odd, across = spark_segments([first, replay, cross])
    res = reconcile([Published(STREAM, 2, 0, 103), Published(STREAM, 3, 0, 20)], segs)
    assert (res.unaccounted_frames, res.delivered, odd, across) == (0, 100, [], 1)


def test_30_3_spark_first_batch_start_offset_none_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """PySpark gives the first batch's start offset as the text "None": the report must read
    the file (the first run with a Spark query ended in a JSONDecodeError), the first batch
    has nothing to check against and the next one is a segment."""
    off = {"105": {"epoch": 2, "seq": 8887, "frames": 0, "lost": 0, "lostLate": 0}}
    nxt = {"105": {"epoch": 2, "seq": 9998, "frames": 64, "lost": 1047, "lostLate": 0}}
    lines = [
        {"batch": 0, "rows": []},
        {"progress": 0, "offsets": [["None", json.dumps(off)]]},
        {"batch": 1, "rows": [[105, 2, 64, 64, 9934, 9997]]},
        {"progress": 1, "offsets": [[json.dumps(off), json.dumps(nxt)]]},
    ]
    (tmp_path / "batches.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    batches = spark_batches(tmp_path)
    assert [(b.batch_id, b.stream_id, b.start_seq, b.end_seq) for b in batches] == [
        (1, 105, 8887, 9998)
    ]


def test_30_5_a_double_count_names_its_segment() -> None:
    """A seq delivered and also counted (or counted twice) is no loss, but the 30-minute run's
    668 such seqs could not be traced: the ledger names each segment with its counters."""
    seg = Segment("c", STREAM, 1, 0, 9, delivered=9, drops_gap=0, drops={"torn_read": 2})
    res = reconcile([Published(STREAM, 1, 0, 9)], [seg])
    assert res.unaccounted == [] and res.overcounted == 1
    assert res.overcounted_in == [("c", STREAM, 1, 0, 9, 1, 9, 0, {"torn_read": 2})]


def test_30_3_read_loss_of_a_query_runs_last_batch_is_named_apart_not_hidden() -> None:
    """A restart's first soak run with Spark: batch 6 (the last of its query run) read 37 of
    56 seqs, ``lost`` and ``lostLate`` unchanged: its executors' read-time loss went to the
    stopped run's reader. The shortfall is named (UNREPORTED_AT_STOP), not balanced silently;
    the same shortfall inside a run (the next batch has the same reader) stays unaccounted."""
    last = _batch(6, (1, 2958, 0, 0), (1, 3014, 0, 0), {1: (37, 37, 2958, 3013)}, run="r1")
    after = _batch(7, (1, 3014, 0, 0), (1, 3100, 0, 0), {1: (86, 86, 3014, 3099)}, run="r2")
    segs, odd, _ = spark_segments([last, after])
    res = reconcile([Published(STREAM, 1, 0, 4000)], segs)
    assert (res.unaccounted_frames, odd) == (0, [])
    assert res.dropped == {UNREPORTED_AT_STOP: 19}
    inside = _batch(7, (1, 3014, 0, 0), (1, 3100, 0, 0), {1: (86, 86, 3014, 3099)}, run="r1")
    segs, _odd, _ = spark_segments([last, inside])
    res = reconcile([Published(STREAM, 1, 0, 4000)], segs)
    assert res.unaccounted_frames == 19 and UNREPORTED_AT_STOP not in res.dropped


def test_30_5_revoked_drops_are_the_revoked_epochs_not_counted_twice_in_the_next_range() -> None:
    """The 30-minute run's "overcounted" seqs (1 224 in the second run, 668 in the first) were
    each segment's ``revoked`` drops twice: the consumer counts a revoked epoch's skipped
    descriptors in ``drops_gap`` and as ``revoked`` while the next mapping is current, so they
    land in the new epoch's segment, whose range they are not in. Seen in the run:
    consumer-108 epoch 67, seqs 0..254 all delivered, drops_gap 40, revoked 40."""
    assert consumer_core.REVOKED == REVOKED
    seg = Segment("consumer-108", 108, 67, 0, 254, 255, 40, {"revoked": 40})
    res = reconcile([Published(108, 67, 0, 300)], [seg])
    assert (res.overcounted, res.unaccounted_frames) == (0, 0)
    # a gap of this range still counts, beside the revoked epoch's drops
    seg = Segment("consumer-108", 108, 67, 0, 254, 250, 45, {"revoked": 40})
    res = reconcile([Published(108, 67, 0, 300)], [seg])
    assert (res.overcounted, res.unaccounted_frames) == (0, 0)
