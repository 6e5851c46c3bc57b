"""Bad input on the control stream never crashes a consumer and never maps what it should not.

Wire Spec §10.1.1 (announce handling), §15.21a.5 (path containment), §15.22 (backend
validation), §7.1/§15.1 (superblock validation).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

STREAM = 9


def _announce(path: str, *, epoch: int = 5, stream: int = STREAM) -> bytes:
    buf = bytearray(4096)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=stream,
        producer_id=1,
        epoch=epoch,
        announce_timestamp_ns=time.monotonic_ns(),
        announce_clock_domain=1,
        layout_version=1,
        header_nslots=8,
        header_slot_bytes=256,
        payload_pools=[(1, 8, 4096, f"shm:file?path={path}.pool")],
        header_region_uri=f"shm:file?path={path}",
    )
    return bytes(buf[:n])


@pytest.fixture
def setup(media_driver, shm_base):
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=200_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        consumer = Consumer(ctx, STREAM, settings)
        ch = settings.channels
        pub = ctx.add_publication(ch.control_channel, ch.control_stream_id)
        assert pub.await_connected(10)
        yield ctx, consumer, pub, settings
        consumer.close()


def _inject(consumer: Consumer, pub, payload: bytes) -> None:
    assert pub.offer(payload)
    for _ in range(20):
        consumer.poll(lambda f: None)
        time.sleep(0.005)


def test_s10_1_1_garbage_and_malformed_control_messages_counted(setup) -> None:
    _ctx, consumer, pub, _s = setup
    rng = random.Random(1)
    _inject(consumer, pub, bytes(rng.getrandbits(8) for _ in range(3)))  # shorter than a header
    _inject(consumer, pub, b"\x10\x00\x04\x00\x39\x05\x01\x00" + bytes(16))  # schema id 1337
    good = _announce("/nonexistent/header.ring")
    _inject(consumer, pub, good[:30])  # truncated announce
    for _ in range(50):  # random junk never raises out of poll
        _inject(consumer, pub, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))))
    control = consumer.stats.control.snapshot()
    assert control.get("truncated", 0) >= 2, control
    assert control.get("unknown_schema_id", 0) >= 1, control
    assert not consumer.is_mapped


def test_s15_21a_5_announce_outside_base_dir_not_mapped(setup, tmp_path) -> None:
    _ctx, consumer, pub, _s = setup
    outside = tmp_path / "header.ring"  # a real file, but not under the consumer's base dir
    outside.write_bytes(bytes(64 + 8 * 256))
    _inject(consumer, pub, _announce(str(outside)))
    assert consumer.stats.control["path_outside_allowed_base"] >= 1
    assert not consumer.is_mapped


def test_s15_21a_5_announce_of_a_fifo_not_mapped(setup) -> None:
    _ctx, consumer, pub, settings = setup
    fifo = os.path.join(settings.shm_base_dir, "evil.ring")
    os.mkfifo(fifo)
    _inject(consumer, pub, _announce(fifo))
    assert consumer.stats.control["path_not_regular_file"] >= 1
    assert not consumer.is_mapped


def test_s7_1_superblock_with_wrong_magic_not_mapped(setup) -> None:
    _ctx, consumer, pub, settings = setup
    path = os.path.join(settings.shm_base_dir, "bad-magic.ring")
    with open(path, "wb") as f:
        f.write(b"NOTMAGIC" + bytes(64 - 8 + 8 * 256))
    _inject(consumer, pub, _announce(path))
    assert consumer.stats.control["superblock_bad_magic"] >= 1, consumer.stats.control.snapshot()
    assert not consumer.is_mapped


def test_consumer_survives_bad_input_then_maps_a_real_producer(setup) -> None:
    ctx, consumer, pub, settings = setup
    _inject(consumer, pub, b"\xff" * 40)
    _inject(consumer, pub, _announce(os.path.join(settings.shm_base_dir, "missing.ring")))
    assert consumer.stats.control["path_not_found"] >= 1
    producer = Producer(ctx, StreamConfig.for_frame_bytes(STREAM, 4096), settings)
    try:
        deadline = time.monotonic() + 10
        while not consumer.is_mapped and time.monotonic() < deadline:
            producer.do_work()
            consumer.poll(lambda f: None)
            time.sleep(0.01)
        assert consumer.is_mapped and consumer.epoch == producer.epoch
        got: list[int] = []
        producer.offer(np.arange(100, dtype=np.int32))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            consumer.poll(lambda f: got.append(int(f.array[99])))
        assert got == [99]
    finally:
        producer.close()
