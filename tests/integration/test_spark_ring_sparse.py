"""The Spark source's executor read over a relay's stream, whose seqs have gaps.

A rate limiter or bridge keeps its source's seq numbers (RateLimiter §4, Bridge §6), so
most seqs of its output stream were never published. They are not data loss: only a frame
that was published and then overwritten is. No SparkSession needed: this drives the
executor-side reader directly.
"""

from __future__ import annotations

import time

import numpy as np

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.spark_source.plan.offsets import to_runs
from tensorpool.spark_source.rings import mapped_rings
from tensorpool.spark_source.rings.mapped_rings import RegionSpec, mapped, read_range
from tensorpool.spark_source.spark.source import arrow_schema
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext


def _layout(media_driver, shm_base, seqs: list[int], nslots: int):
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )
    ctx = AeronContext(settings.transport).start()
    producer = Producer(
        ctx, StreamConfig(6, header_nslots=nslots, pools=(PoolConfig(1, 4096),)), settings
    )
    consumer = Consumer(ctx, 6, settings)
    deadline = time.monotonic() + 10
    while not consumer.is_mapped and time.monotonic() < deadline:
        producer.do_work()
        consumer.poll(lambda f: None)
        time.sleep(0.005)
    assert consumer.is_mapped and consumer.layout is not None
    for seq in seqs:
        claim = producer.claim((4,), np.int64, seq=seq)
        assert claim is not None
        claim.array[:] = seq
        producer.commit(claim)
    return ctx, producer, consumer, consumer.layout


def _read(layout, shm_base, first: int, end: int, runs=None):
    lost: list[tuple[int, str]] = []
    batches = list(
        read_range(
            RegionSpec.from_layout(layout),
            (shm_base,),
            first,
            end,
            include_meta=True,
            on_loss=lambda s, r: lost.append((s, r)),
            schema=arrow_schema(True),
            runs=runs,
        )
    )
    got = [s for b in batches for s in b.column("seq").to_pylist()]
    return got, lost


def test_never_published_seqs_of_a_relay_stream_are_not_data_loss(media_driver, shm_base):
    """A range shorter than the ring: each never-published seq's slot still holds an older
    frame, which proves the seq was never written there (slots only move forward)."""
    sparse = list(range(103, 164, 10))  # every 10th seq, as a 10x rate limiter publishes
    ctx, producer, consumer, layout = _layout(
        media_driver, shm_base, [*range(100), *sparse], nslots=64
    )
    try:
        got, lost = _read(layout, shm_base, sparse[0], sparse[-1] + 1)
        assert got == sparse
        assert lost == []
    finally:
        consumer.close()
        producer.close()
        ctx.close()


def test_overwritten_frames_are_still_data_loss(media_driver, shm_base):
    seqs = list(range(0, 40))  # dense; the 16-slot ring keeps only the last 16
    ctx, producer, consumer, layout = _layout(media_driver, shm_base, seqs, nslots=16)
    try:
        got, lost = _read(layout, shm_base, 0, 40)
        assert got == list(range(24, 40))
        assert [s for s, _ in lost] == list(range(24))
    finally:
        consumer.close()
        producer.close()
        ctx.close()


def test_planned_runs_of_a_sparse_stream_span_more_seqs_than_slots(media_driver, shm_base):
    """The plan's explicit seqs: a relay's frames (every 10th seq) over a span of 30x the ring
    are read exactly, with no false loss; a planned frame overwritten since is loss, even where
    a range read could not tell (its slot holds a newer seq)."""
    seqs = list(range(0, 2000, 10))  # 200 frames use only 32 of the 64 slots: the last 32 stay
    ctx, producer, consumer, layout = _layout(media_driver, shm_base, seqs, nslots=64)
    try:
        st = mapped(RegionSpec.from_layout(layout), (shm_base,)).scan()
        assert st.gapped
        present = st.present(0, 2000)
        assert present.tolist() == seqs[-32:]
        got, lost = _read(layout, shm_base, 0, 2000, runs=to_runs(present))
        assert got == seqs[-32:] and lost == []
        # planned earlier (when 1680 was still there): its loss is reported, nothing else
        runs = to_runs(np.asarray([seqs[-33], *seqs[-32:]]))
        got, lost = _read(layout, shm_base, 0, 2000, runs=runs)
        assert got == seqs[-32:] and [s for s, _ in lost] == [seqs[-33]]
    finally:
        consumer.close()
        producer.close()
        ctx.close()


def test_dense_runs_stay_on_the_vectorized_path(media_driver, shm_base, monkeypatch):
    """A normal stream's plan is one run, read by the vectorized seqlock path only."""
    ctx, producer, consumer, layout = _layout(media_driver, shm_base, list(range(50)), nslots=64)
    slow: list[int] = []
    real = mapped_rings._read_chunk

    def spy(m, chunk, *a, **k):
        slow.append(len(chunk))
        return real(m, chunk, *a, **k)

    monkeypatch.setattr(mapped_rings, "_read_chunk", spy)
    try:
        got, lost = _read(layout, shm_base, 10, 50, runs=to_runs(np.arange(10, 50)))
        assert got == list(range(10, 50)) and lost == [] and slow == []
    finally:
        consumer.close()
        producer.close()
        ctx.close()
