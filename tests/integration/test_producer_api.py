"""Producer API details: explicit seq and layout (relays), metadata versions (§10.3),
no-pool-fits drops (§9), layout preservation (§8.2), the consumer's owned-copy iterator."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.shm.tensor import TensorLayout
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

_STREAMS = itertools.count(4)


@pytest.fixture
def pair(media_driver, shm_base):
    # a stream of its own per test: the module's media driver may still hold the previous
    # test's descriptor publication (lingering) with the same stream, epoch 1 and seq 0, and a
    # consumer that maps at once reads that descriptor as this producer's first frame
    stream_id = next(_STREAMS)
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        stream = StreamConfig(
            stream_id, header_nslots=64, pools=(PoolConfig(1, 4096), PoolConfig(2, 65536))
        )
        producer = Producer(ctx, stream, settings)
        consumer = Consumer(ctx, stream_id, settings)
        deadline = time.monotonic() + 10
        while not consumer.is_mapped and time.monotonic() < deadline:
            producer.do_work()
            consumer.poll(lambda f: None)
            time.sleep(0.005)
        assert consumer.is_mapped
        yield producer, consumer
        consumer.close()
        producer.close()


def _drain(consumer: Consumer, seconds: float = 2.0) -> list:
    out = []
    deadline = time.monotonic() + seconds
    for frame in consumer.frames(max_idle_polls=50, idle=lambda: time.sleep(0.002)):
        out.append(frame)
        if time.monotonic() > deadline:
            break
    return out


def test_explicit_seq_preserves_numbering_and_leaves_gaps(pair) -> None:
    producer, consumer = pair
    for seq in (10, 11, 15):
        claim = producer.claim((8,), np.int32, seq=seq)
        assert claim is not None
        claim.array[:] = seq
        producer.commit(claim, timestamp_ns=1000 + seq, meta_version=3)
    with pytest.raises(ValueError, match="backwards"):
        producer.claim((8,), np.int32, seq=12)
    frames = _drain(consumer)
    assert [f.seq for f in frames] == [10, 11, 15]
    assert [f.timestamp_ns for f in frames] == [1010, 1011, 1015]
    assert all(f.meta_version == 3 and int(f.array[0]) == f.seq for f in frames)
    assert consumer.drops_gap == 3  # 12, 13, 14


def test_s8_2_layout_is_preserved_column_major(pair) -> None:
    producer, consumer = pair
    src = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    layout = TensorLayout.from_array(src)
    claim = producer.claim(layout=layout)
    assert claim is not None
    claim.array[...] = src
    producer.commit(claim)
    (frame,) = _drain(consumer)
    np.testing.assert_array_equal(frame.array, src)
    assert frame.array.flags.f_contiguous and frame.array.dtype == np.float32


def test_s9_no_pool_fits_is_dropped_and_counted(pair) -> None:
    producer, consumer = pair
    assert producer.offer(np.zeros(65536 + 1, np.uint8)) is None
    assert producer.stats.drops["no_pool_fits"] == 1
    assert producer.offer(np.zeros(5000, np.uint8)) == 0  # goes to the 64 KiB pool
    (frame,) = _drain(consumer)
    assert frame.array.size == 5000


def test_s10_3_metadata_version_is_published_and_can_be_preserved(pair) -> None:
    producer, consumer = pair
    assert producer.set_metadata({"instrument": "cam-1", "blob": b"\x00\x01"}) == 1
    assert producer.set_metadata({"instrument": "cam-1"}, meta_version=41) == 41
    deadline = time.monotonic() + 5
    while consumer.meta_version != 41 and time.monotonic() < deadline:
        consumer.poll(lambda f: None)
        time.sleep(0.005)
    assert consumer.meta_version == 41
    assert consumer.metadata == {"instrument": ("text/plain", b"cam-1")}
    producer.offer(np.zeros(4, np.uint8))
    (frame,) = _drain(consumer)
    assert frame.meta_version == 41
