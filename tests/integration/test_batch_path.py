"""The batch fast path end to end (issue #15): ``Producer.offer_batch`` / ``claim_batch`` +
``commit_batch`` and ``Consumer.poll_batch`` over a real media driver and real SHM files, with
the per-frame path's drop reasons and counters (Wire §8.3, §10.2.1, §15.4)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer, FrameBatch
from tensorpool.client.consumer_core import EPOCH_MISMATCH, SEQ_IMPLAUSIBLE
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import LATE_REASONS, Reason
from tensorpool.endpoints import Endpoints
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

NSLOTS = 16
STREAM = 15
_ids = itertools.count(41_000, 10)


@pytest.fixture
def pair(media_driver, shm_base):
    base = next(_ids)  # fresh Aeron streams per test: no descriptor of an earlier test
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        channels=Endpoints(
            control_stream_id=base,
            descriptor_stream_id=base + 1,
            qos_stream_id=base + 2,
            metadata_stream_id=base + 3,
        ),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        stream = StreamConfig(
            STREAM, header_nslots=NSLOTS, pools=(PoolConfig(1, 4096), PoolConfig(2, 65536))
        )
        producer = Producer(ctx, stream, settings)
        consumer = Consumer(ctx, STREAM, settings)
        deadline = time.monotonic() + 10
        while not consumer.is_mapped and time.monotonic() < deadline:
            producer.do_work()
            consumer.poll(lambda f: None)
            time.sleep(0.005)
        assert consumer.is_mapped
        yield producer, consumer, ctx, settings
        consumer.close()
        producer.close()


def _poll(consumer: Consumer, want: int, *, copy: bool = False, seconds: float = 5.0) -> FrameBatch:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = consumer.poll_batch(want, copy=copy)
        if len(batch):
            return batch
        time.sleep(0.001)
    raise AssertionError("no batch arrived")


def test_offer_batch_is_read_as_one_stacked_zero_copy_batch(pair) -> None:
    producer, consumer, _, _ = pair
    frames = np.arange(8 * 256, dtype=np.float32).reshape(8, 16, 16)
    ts = np.arange(100, 108, dtype=np.uint64)
    first = producer.offer_batch(frames, timestamps_ns=ts, meta_version=4)
    assert first == 0 and producer.next_seq == 8
    batch = _poll(consumer, 64)
    assert len(batch) == 8 and batch.valid.all()
    assert batch.seqs.tolist() == list(range(8))
    assert batch.timestamps_ns.tolist() == list(range(100, 108))
    assert batch.meta_versions.tolist() == [4] * 8
    assert batch.array is not None and batch.array.shape == (8, 16, 16)
    assert not batch.array.flags.writeable and not batch.copied  # a view of the slots
    np.testing.assert_array_equal(batch.array, frames)
    assert consumer.stats.frames == 0  # counted once the views are confirmed
    assert batch.confirm() == 8
    assert consumer.stats.frames == 8 and consumer.stats.bytes == frames.nbytes
    assert consumer.drops_gap == 0 and consumer.drops_late == 0


def test_claim_batch_stops_at_the_wrap_and_copy_mode_owns_the_data(pair) -> None:
    producer, consumer, _, _ = pair
    assert producer.offer_batch(np.zeros((NSLOTS - 3, 4), np.int64)) == 0
    _poll(consumer, 64).confirm()
    claim = producer.claim_batch(6, (4,), np.int64)
    assert claim is not None and claim.n == 3 and claim.header_index == NSLOTS - 3
    claim.array[:] = np.arange(NSLOTS - 3, NSLOTS)[:, None]
    assert producer.commit_batch(claim, timestamps_ns=7) == NSLOTS - 3
    claim = producer.claim_batch(3, (4,), np.int64)
    assert claim is not None and claim.n == 3 and claim.header_index == 0
    claim.array[:] = np.arange(NSLOTS, NSLOTS + 3)[:, None]
    producer.commit_batch(claim, timestamps_ns=8)
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        batch = consumer.poll_batch(64, copy=True)
        if len(batch):
            assert batch.copied and batch.valid.all()
            assert batch.array is not None and batch.array.flags.owndata
            got += batch.array[:, 0].tolist()
            assert got == batch.seqs.tolist() or len(got) > len(batch)
    assert got == list(range(NSLOTS - 3, NSLOTS + 3))
    assert consumer.drops_late == 0 and consumer.drops_gap == 0


def test_mixed_layouts_come_back_as_a_list(pair) -> None:
    producer, consumer, _, _ = pair
    producer.offer(np.ones(4, np.int32))
    producer.offer(np.full((2, 3), 2.0, np.float64))
    producer.offer(np.zeros(20_000, np.uint8))  # pool 2
    batch = _poll(consumer, 64, copy=True)
    if len(batch) < 3:  # the three may straddle two polls
        rest = _poll(consumer, 64, copy=True)
        arrays = [*batch.arrays, *rest.arrays]
    else:
        assert batch.array is None
        arrays = batch.arrays
    assert [a.shape for a in arrays] == [(4,), (2, 3), (20_000,)]  # type: ignore[union-attr]
    assert arrays[1].dtype == np.float64 and float(arrays[1][0, 0]) == 2.0  # type: ignore[index]


def test_s15_4_overrun_is_counted_like_the_per_frame_path(pair) -> None:
    """The producer laps the ring before the consumer polls: the descriptors of overwritten
    frames are late drops (seq_mismatch), the rest are read; nothing is counted twice."""
    producer, consumer, _, _ = pair
    producer.offer_batch(np.zeros((NSLOTS, 8), np.uint8))
    producer.offer_batch(np.ones((4, 8), np.uint8))  # seqs 16..19 overwrite slots 0..3
    total = 0
    late_before = consumer.drops_late
    deadline = time.monotonic() + 5
    while total < NSLOTS + 4 - 4 and time.monotonic() < deadline:
        batch = consumer.poll_batch(64)
        total += batch.confirm() if len(batch) else 0
    assert total == NSLOTS  # 4..15 and 16..19
    assert consumer.stats.drops[Reason.SEQ_MISMATCH] == 4
    assert consumer.drops_late - late_before == 4


def test_15_s15_4_a_lapped_batch_consumer_skips_what_the_producer_will_overwrite(pair) -> None:
    """Once a batch lost rows to overwrites, the next batch skips (as resync) the frames the
    producer will lap before it is confirmed, assuming it moves as far as since the last."""
    producer, consumer, _, _ = pair
    producer.offer_batch(np.zeros((NSLOTS, 8), np.uint8))  # 0..15
    assert _poll(consumer, 64).confirm() == NSLOTS
    producer.offer_batch(np.zeros((NSLOTS, 8), np.uint8))  # 16..31
    batch = _poll(consumer, 64)
    assert batch.seqs.tolist() == list(range(NSLOTS, 2 * NSLOTS)) and consumer.core.resyncs == 0
    producer.offer_batch(np.ones((4, 8), np.uint8))  # 32..35 overwrite 16..19 before confirm
    assert batch.confirm() == NSLOTS - 4
    producer.offer_batch(np.ones((NSLOTS, 8), np.uint8))  # 36..51: moved 20 since the last
    batch = _poll(consumer, 64)  # 32..47 (the ring's wrap): within 4 of 51 is only 47
    assert batch.seqs.tolist() == [47] and batch.confirm() == 1
    assert consumer.core.resyncs == 15  # 32..35 overwritten already, 36..46 predicted


def test_30_a_poll_drains_other_streams_descriptors_its_limit_counts_its_own(pair) -> None:
    """On a shared descriptor stream, ``poll_batch(max_frames)`` bounds this consumer's frames,
    not the other producers' traffic: one call passes over every queued descriptor of another
    stream and returns its own frame behind them. Before, the other streams' descriptors
    filled the batch: the rate limiter, which sleeps to its next slot after a poll without
    its frames, drained 256 of ~7,000 a second, and IPC flow control then held back every
    producer on the stream (#30 soak: 34 % of a 1 kHz stream's descriptors never sent)."""
    producer, consumer, ctx, settings = pair
    ch = settings.channels
    pub = ctx.add_publication(ch.descriptor_channel, ch.descriptor_stream_id)
    buf = bytearray(64)
    deadline = time.monotonic() + 10
    for seq in range(100):  # another producer's stream on the same descriptor stream
        n = wire.FrameDescriptorEncoder.encode(
            buf, 0, stream_id=STREAM + 50, epoch=1, seq=seq, header_index=seq % NSLOTS,
            timestamp_ns=0, meta_version=0,
        )  # fmt: skip
        while not pub.offer(buf, 0, n):
            assert time.monotonic() < deadline, "the forged publication never connected"
            time.sleep(0.001)
    producer.offer(np.full(8, 7, np.uint8))
    before = consumer.stats.descriptors
    drops_before = consumer.stats.drops.snapshot()
    batch = consumer.poll_batch(4)  # IPC: what was offered is in the log already
    assert len(batch) == 1 and batch.seqs.tolist() == [0]
    assert batch.confirm() == 1
    assert consumer.stats.descriptors - before == 101  # all polled, none recorded as ours
    assert consumer.stats.drops.snapshot() == drops_before  # not ours: no drop reason
    ctx.release(pub)


def _forge(ctx: AeronContext, settings: ClientSettings, **fields: int) -> None:
    ch = settings.channels
    pub = ctx.add_publication(ch.descriptor_channel, ch.descriptor_stream_id)
    buf = bytearray(64)
    n = wire.FrameDescriptorEncoder.encode(
        buf, 0, timestamp_ns=0, meta_version=0, header_index=fields.pop("header_index"), **fields
    )
    deadline = time.monotonic() + 5
    while not pub.offer(buf, 0, n):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    ctx.release(pub)


def test_s10_2_1_forged_descriptors_are_dropped_with_their_reasons(pair) -> None:
    producer, consumer, ctx, settings = pair
    producer.offer_batch(np.zeros((3, 8), np.uint8))
    _poll(consumer, 64).confirm()
    epoch = producer.epoch
    # wrong epoch, a next seq the ring never held, another stream's descriptor
    _forge(ctx, settings, stream_id=STREAM, epoch=epoch + 7, seq=3, header_index=3)
    _forge(ctx, settings, stream_id=STREAM, epoch=epoch, seq=3, header_index=3)
    _forge(ctx, settings, stream_id=STREAM + 1, epoch=epoch, seq=3, header_index=3)
    deadline = time.monotonic() + 5
    drops = consumer.stats.drops
    while drops[SEQ_IMPLAUSIBLE] < 1 and time.monotonic() < deadline:
        assert len(consumer.poll_batch(64)) == 0 or True
        time.sleep(0.001)
    assert drops[EPOCH_MISMATCH] == 1
    assert drops[SEQ_IMPLAUSIBLE] == 1 and drops[Reason.SEQ_MISMATCH] == 0
    assert consumer.drops_late == 0
    # the real frame 3 is still read afterwards
    producer.offer_batch(np.full((1, 8), 3, np.uint8))
    batch = _poll(consumer, 64)
    assert batch.seqs.tolist() == [3] and batch.confirm() == 1


def test_cli_produce_and_consume_take_the_batch_path(media_driver, shm_base) -> None:
    """``tensorpool produce --batch`` and ``consume --batch`` move frames end to end."""
    base = next(_ids)
    common = [
        "--aeron-dir",
        media_driver.dir,
        "--shm-base-dir",
        shm_base,
        "--stream-id",
        "31",
        "--control-stream-id",
        str(base),
        "--descriptor-stream-id",
        str(base + 1),
        "--qos-stream-id",
        str(base + 2),
        "--metadata-stream-id",
        str(base + 3),
    ]
    cons = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "consume", *common, "--batch", "32",
         "--duration", "8", "--count", "1500", "--json", "--report-interval", "0.5"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        prod = subprocess.run(
            [sys.executable, "-m", "tensorpool", "produce", *common, "--batch", "8",
             "--shape", "32,32", "--rate", "1000", "--duration", "4", "--quiet"],
            timeout=60, capture_output=True, text=True,
        )  # fmt: skip
        assert prod.returncode == 0, prod.stderr
        out, _ = cons.communicate(timeout=60)
    finally:
        if cons.poll() is None:
            cons.kill()
            cons.wait()
    final = json.loads(out.strip().splitlines()[-1])
    assert final["final"] and final["frames"] > 500, final
    assert final["latency_us_p50"] is not None, final
    # a descheduled consumer may be lapped (late drops); nothing may be malformed
    assert set(final["drops"]) <= LATE_REASONS | {"before_join", "resync"}, final


def test_a_batch_stops_at_the_ring_wrap_and_the_rest_comes_next(pair) -> None:
    """Zero-copy batches are one view: descriptors beyond the wrap wait for the next call."""
    producer, consumer, _, _ = pair
    producer.offer_batch(np.zeros((NSLOTS - 3, 4), np.int64))
    _poll(consumer, 64).confirm()
    producer.offer_batch(np.arange(NSLOTS - 3, NSLOTS + 3)[:, None] * np.ones(4, np.int64))
    time.sleep(0.05)  # all six descriptors are in the log before the poll
    first = _poll(consumer, 64)
    assert first.seqs.tolist() == [NSLOTS - 3, NSLOTS - 2, NSLOTS - 1]
    assert not first.copied and first.array is not None and first.array[:, 0].tolist() == [
        NSLOTS - 3, NSLOTS - 2, NSLOTS - 1,
    ]  # fmt: skip
    first.confirm()
    second = consumer.poll_batch(64)  # the carried rows, without waiting for Aeron
    assert second.seqs.tolist() == [NSLOTS, NSLOTS + 1, NSLOTS + 2] and not second.copied
    assert second.confirm() == 3 and consumer.drops_late == 0 and consumer.drops_gap == 0


def test_a_paced_single_frame_batch_is_a_full_batch_of_its_own(pair) -> None:
    # one frame per poll (a paced stream) takes the per-frame read as a RowBatch: its columns
    # are the same as a stacked batch's, counted once, and each batch keeps its own data
    producer, consumer, _, _ = pair
    frame = np.arange(16, dtype=np.float32).reshape(4, 4)
    producer.offer_batch(frame[None], timestamps_ns=np.array([123], np.uint64), meta_version=5)
    batch = _poll(consumer, 64)
    assert len(batch) == 1 and batch.valid.tolist() == [True] and batch.codes.tolist() == [0]
    assert batch.seqs.tolist() == [0] and batch.header_index.tolist() == [0]
    assert batch.timestamps_ns.tolist() == [123] and batch.meta_versions.tolist() == [5]
    assert batch.values_len.tolist() == [frame.nbytes] and batch.pool_id.tolist() == [1]
    assert batch.array is not None and batch.array.shape == (1, 4, 4) and not batch.copied
    np.testing.assert_array_equal(batch.array[0], frame)
    assert consumer.stats.frames == 0 and batch.confirm() == 1 and batch.confirm() == 1
    assert consumer.stats.frames == 1 and consumer.stats.bytes == frame.nbytes
    # a copied batch belongs to the caller: the next polls leave it and its columns intact
    producer.offer(frame + 1)
    owned = _poll(consumer, 64, copy=True)
    producer.offer(frame + 2)
    later = _poll(consumer, 64, copy=True)
    assert later is not owned and later.seqs.tolist() == [2]
    np.testing.assert_array_equal(owned.array[0], frame + 1)  # type: ignore[index]
    assert owned.seqs.tolist() == [1] and owned.valid.tolist() == [True]
    assert owned.confirm() == 1 and later.confirm() == 1
    assert consumer.stats.frames == 3  # a copied batch is counted once, confirmed or not


def test_a_copied_batch_is_counted_once_when_the_caller_confirms_it(pair) -> None:
    producer, consumer, _, _ = pair
    producer.offer_batch(np.ones((4, 8), np.int64))
    batch = _poll(consumer, 64, copy=True)
    assert len(batch) == 4 and batch.copied
    assert batch.confirm() == 4
    assert consumer.stats.frames == 4 and consumer.stats.bytes == 4 * 64


def test_a_single_frame_overwritten_before_confirm_is_torn(pair) -> None:
    producer, consumer, _, _ = pair
    producer.offer(np.ones(8, np.int64))
    batch = _poll(consumer, 64)
    assert len(batch) == 1 and batch.valid.all()
    for _ in range(NSLOTS):  # the producer laps the ring: the slot holds seq NSLOTS now
        producer.offer(np.zeros(8, np.int64))
    late = consumer.drops_late
    assert batch.confirm() == 0 and batch.confirm() == 0
    assert batch.valid.tolist() == [False] and batch.reasons() == [Reason.TORN_READ]
    assert consumer.drops_late == late + 1 and consumer.stats.frames == 0
