"""The bridge receiver over real UDP: hand-made chunks in, real FrameDescriptors out.

One process, one embedded Aeron media driver, real UDP on 127.0.0.1: the test publishes raw
``BridgeFrameChunk``/``ShmPoolAnnounce``/metadata/progress messages on the bridge channels,
a real :class:`BridgeApp` (receiver role, standalone destination) re-materializes them into
real SHM, and a real :class:`Consumer` of the destination stream reports what a local
application would see. Section numbers refer to the Bridge Spec v1.0.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from bridge_wire import header_slot
from netports import free_udp_ports

from tensorpool.bridge.app import BridgeApp
from tensorpool.bridge.chunker import Chunker
from tensorpool.bridge.config import BridgeConfig, parse_bridge_config
from tensorpool.bridge.reasons import ChunkDrop, FrameDrop
from tensorpool.client.consumer import Consumer, Frame
from tensorpool.shm.tensor import WIRE_TO_NUMPY, TensorLayout
from tensorpool.specs import peek_header
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher

pytestmark = pytest.mark.slow

SRC = 10000
DEST = 20000
CHUNK = 1280
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


@dataclass
class Seen:
    seq: int
    epoch: int
    timestamp_ns: int
    meta_version: int
    shape: tuple[int, ...]
    dtype: np.dtype
    data: bytes
    values_len: int = -1
    raw: bytes = b""


@dataclass
class Harness:
    cfg: BridgeConfig
    ctx: AeronContext
    app: BridgeApp
    payload: Publisher
    control: Publisher
    metadata: Publisher
    consumer: Consumer
    seen: list[Seen] = field(default_factory=list)
    epochs: set[int] = field(default_factory=set)
    _buf: bytearray = field(default_factory=lambda: bytearray(1 << 16))

    # -- driving -------------------------------------------------------------------------
    def _take(self, f: Frame) -> None:
        data = f.array.tobytes(order="A") if f.values_len_bytes else b""
        raw = bytes(f.raw_views()[1])
        if f.is_current():
            self.seen.append(
                Seen(
                    f.seq,
                    f.epoch,
                    f.timestamp_ns,
                    f.meta_version,
                    f.shape,
                    WIRE_TO_NUMPY[f.dtype],
                    data,
                    f.values_len_bytes,
                    raw,
                )
            )

    def pump(self, seconds: float = 0.0, until: Callable[[], bool] | None = None) -> None:
        deadline = time.monotonic() + (seconds if until is None else 15.0)
        end = time.monotonic() + seconds
        while True:
            self.app.do_work()
            self.consumer.poll(self._take)
            if self.consumer.epoch is not None:
                self.epochs.add(self.consumer.epoch)
            now = time.monotonic()
            if until is not None and until():
                return
            if until is None and now >= end:
                return
            if now > deadline:
                raise AssertionError(f"condition not met; status {self.app.status()}")
            time.sleep(0.0005)

    def send(self, pub: Publisher, msg: bytes) -> None:
        deadline = time.monotonic() + 10
        while not pub.offer(msg):
            assert time.monotonic() < deadline, f"offer failed: {pub.counters}"
            self.app.do_work()
            time.sleep(0.001)

    def announce(self, epoch: int, stride: int = 1 << 20) -> None:
        n = wire.ShmPoolAnnounceEncoder.encode(
            self._buf, 0, stream_id=SRC, producer_id=9, epoch=epoch,
            announce_timestamp_ns=time.monotonic_ns(), announce_clock_domain=1,
            layout_version=1, header_nslots=64, header_slot_bytes=256,
            payload_pools=[(1, 64, stride, "shm:file?path=/nonexistent/on/this/host")],
            header_region_uri="shm:file?path=/nonexistent/on/this/host",
        )  # fmt: skip
        self.send(self.control, bytes(self._buf[:n]))

    def chunks(self, seq: int, array: np.ndarray, *, epoch: int = 1, ts: int = 0) -> list[bytes]:
        layout = TensorLayout.from_array(array)
        raw = array.tobytes(order="A")
        hdr = header_slot(seq, layout, len(raw), ts or 1_000_000 + seq)
        return Chunker(CHUNK).encode_frame(
            stream_id=SRC, epoch=epoch, seq=seq, header=hdr, payload=raw
        )

    def inject(self, msgs: list[bytes]) -> None:
        for m in msgs:
            self.send(self.payload, m)

    def rx(self) -> dict[str, object]:
        return next(r for r in self.app.status() if r["role"] == "receiver")

    def wait_open(self) -> None:
        self.pump(until=lambda: self.rx()["local_epoch"] is not None)
        self.pump(until=lambda: self.consumer.epoch is not None)


@pytest.fixture
def h() -> Iterator[Harness]:
    base = tempfile.mkdtemp(prefix="tp-bridge-rx-", dir=SHM_ROOT)
    p_payload, p_control, p_meta = free_udp_ports(3)
    cfg = parse_bridge_config(
        {
            "bridge": {
                "instance_id": "rx-test",
                "role": "receiver",
                "payload_channel": f"aeron:udp?endpoint=127.0.0.1:{p_payload}",
                "payload_stream_id": 3000,
                "control_channel": f"aeron:udp?endpoint=127.0.0.1:{p_control}",
                "control_stream_id": 3001,
                "metadata_channel": f"aeron:udp?endpoint=127.0.0.1:{p_meta}",
                "metadata_stream_id": 3002,
                "assembly_timeout_ms": 1000,
                "forward_progress": True,
                "forward_qos": True,
            },
            "local": {"driver_mode": False, "shm_base_dir": base, "announce_period_ms": 100},
            "profiles": {
                "p": {
                    "header_nslots": 64,
                    "payload_pools": [{"pool_id": 1, "stride_bytes": 1 << 20}],
                }
            },
            "mappings": [
                {"source_stream_id": SRC, "dest_stream_id": DEST, "profile": "p",
                 "source_control_stream_id": 1000, "dest_control_stream_id": 2201},
            ],
        },
        env={},
    )  # fmt: skip
    ctx = AeronContext(TransportConfig()).start()
    app = BridgeApp(cfg, ctx=ctx)
    b = cfg.bridge
    harness = Harness(
        cfg,
        ctx,
        app,
        ctx.add_publication(b.payload_channel, b.payload_stream_id),
        ctx.add_publication(b.control_channel, b.control_stream_id),
        ctx.add_publication(b.metadata_channel, b.metadata_stream_id),
        Consumer(ctx, DEST, cfg.local.client_settings()),
    )
    try:
        yield harness
    finally:
        harness.consumer.close()
        app.close()
        ctx.close()
        shutil.rmtree(base, ignore_errors=True)


def frame(n: int, seq: int, dtype: str = "<f4") -> np.ndarray:
    return (np.arange(n, dtype=np.float64) * 0.5 + seq).astype(dtype)


# --------------------------------------------------------------------------- tests


def test_s5_2_s6_udp_one_chunk_many_chunks_and_empty(h: Harness) -> None:
    """Exactly one chunk, many chunks (640 KiB), an empty payload: each becomes one local
    frame with the same bytes, shape, dtype, timestamp and seq (§6 steps 8-11)."""
    h.announce(1)
    h.wait_open()
    arrays = {
        1: frame(CHUNK // 4, 1),  # 1280 bytes: exactly one chunk
        2: frame(655360 // 4, 2).reshape(640, 256),  # 512 chunks
        3: np.zeros((0,), "<f4"),  # empty payload
        4: frame(CHUNK // 4 + 1, 4),  # one chunk and 4 bytes
    }
    for seq, arr in arrays.items():
        h.inject(h.chunks(seq, arr))
    h.pump(until=lambda: len(h.seen) == 4)
    for s, (seq, arr) in zip(h.seen, arrays.items(), strict=True):
        assert s.seq == seq and s.timestamp_ns == 1_000_000 + seq
        assert s.shape == arr.shape and s.dtype == arr.dtype
        assert s.data == arr.tobytes()
    # chunks 1-511 of the 640 KiB frame (full size, the last one too) went through the
    # staged-run path with real Aeron buffers; every other chunk one by one
    assert h.app.receiver.run_chunks == 511


def test_s5_2_udp_chunks_before_announce_are_dropped(h: Harness) -> None:
    early = h.chunks(1, frame(4000, 1))
    h.inject(early)
    h.pump(until=lambda: h.rx()["chunk_drops"].get(ChunkDrop.NO_ANNOUNCE, 0) == len(early))
    h.announce(1)
    h.wait_open()
    h.inject(h.chunks(2, frame(4000, 2)))
    h.pump(until=lambda: len(h.seen) == 1)
    assert [s.seq for s in h.seen] == [2]


def test_s5_2_udp_out_of_order_and_duplicates(h: Harness) -> None:
    h.announce(1)
    h.wait_open()
    c = h.chunks(1, frame(2000, 1))  # 7 chunks
    h.inject([c[3], c[0], c[6], c[3], c[1], c[5], c[2], c[0], c[4]])
    h.pump(until=lambda: len(h.seen) == 1)
    h.pump(0.1)
    assert len(h.seen) == 1 and h.seen[0].data == frame(2000, 1).tobytes()
    assert h.rx()["chunk_drops"][ChunkDrop.DUPLICATE] == 2


def test_s5_2_udp_conflicting_and_overlapping_chunks_publish_nothing(h: Harness) -> None:
    h.announce(1)
    h.wait_open()
    c = h.chunks(1, frame(2000, 1))
    conflicting = bytearray(c[2])
    conflicting[-1] ^= 1
    h.inject([c[0], c[1], c[2], bytes(conflicting), *c[3:]])
    d = h.chunks(2, frame(2000, 2))
    overlap = bytearray(d[3])
    struct.pack_into("<I", overlap, 36, 3 * CHUNK - 8)  # chunkOffset into chunk 2's bytes
    h.inject([d[0], d[1], d[2], bytes(overlap), *d[4:]])
    e = h.chunks(3, frame(100, 3))
    h.inject(e)
    h.pump(until=lambda: len(h.seen) == 1)
    assert [s.seq for s in h.seen] == [3]
    drops = h.rx()["frame_drops"]
    assert drops[FrameDrop.CHUNK_CONFLICT] == 1 and drops[FrameDrop.CHUNK_OVERLAP] == 1


def test_s5_3_s5_3a_udp_missing_chunk_times_out_without_descriptor(h: Harness) -> None:
    h.announce(1)
    h.wait_open()
    c = h.chunks(1, frame(2000, 1))
    h.inject(c[:4] + c[5:])
    h.pump(until=lambda: h.rx()["assembly_timeouts"] == 1)
    h.inject([c[4]])  # too late: the frame is gone
    h.pump(0.2)
    assert h.seen == []
    assert h.rx()["chunk_drops"][ChunkDrop.STALE_SEQ] == 1


def test_s8_udp_epoch_change_mid_frame_and_older_epoch(h: Harness) -> None:
    """A new source epoch drops the frame in flight, reopens the destination with a higher
    local epoch, and chunks of the old epoch are dropped from then on."""
    h.announce(1)
    h.wait_open()
    h.inject(h.chunks(5, frame(100, 5)))
    h.pump(until=lambda: len(h.seen) == 1)
    first_local = h.seen[0].epoch
    old = h.chunks(6, frame(2000, 6), epoch=1)
    h.inject(old[:3])
    h.pump(until=lambda: h.rx()["chunks"] >= 4)
    h.announce(2)
    h.pump(until=lambda: h.rx()["source_epoch"] == 2 and h.rx()["local_epoch"] > first_local)
    h.inject(old[3:])  # rest of the epoch-1 frame
    h.inject(h.chunks(0, frame(300, 0), epoch=2))  # the new epoch restarts its seqs
    h.pump(until=lambda: len(h.seen) == 2)
    assert [s.seq for s in h.seen] == [5, 0]
    assert h.seen[1].epoch > first_local
    rx = h.rx()
    assert rx["frame_drops"][FrameDrop.EPOCH_CHANGE] == 1
    assert rx["chunk_drops"][ChunkDrop.STALE_EPOCH] == len(old) - 3
    h.announce(1)  # an older announce after the newer one changes nothing
    h.pump(0.1)
    assert h.rx()["source_epoch"] == 2


def test_s5_2_udp_oversized_lengths_rejected(h: Harness) -> None:
    h.announce(1, stride=1 << 16)
    h.wait_open()
    c = h.chunks(1, frame(100, 1))
    big_plen = bytearray(c[0])
    struct.pack_into("<I", big_plen, 44, 1 << 29)  # payloadLength far beyond the stride
    struct.pack_into("<I", big_plen, 32, 65535)
    big_chunk = bytearray(57 + 5000)  # chunkLength above the 1280-byte bound
    Chunker.encode(big_chunk, 0, stream_id=SRC, epoch=1, seq=2, chunk_index=1, chunk_count=2,
                   chunk_offset=5000, payload_length=10000, header=None,
                   payload=bytes(5000))  # fmt: skip
    h.inject([bytes(big_plen), bytes(big_chunk)])
    h.pump(until=lambda: sum(h.rx()["chunk_drops"].values()) == 2)
    drops = h.rx()["chunk_drops"]
    assert drops == {ChunkDrop.PAYLOAD_EXCEEDS_SOURCE_STRIDE: 1, ChunkDrop.CHUNK_TOO_LARGE: 1}
    h.inject(h.chunks(3, frame(100, 3)))
    h.pump(until=lambda: len(h.seen) == 1)


def test_s7_1_udp_metadata_republished_with_rewritten_stream_id(h: Harness) -> None:
    h.announce(1)
    h.wait_open()
    buf = bytearray(4096)
    n = wire.DataSourceAnnounceEncoder.encode(
        buf, 0, stream_id=SRC, producer_id=9, epoch=1, meta_version=41, name="cam-front",
        summary="640x256 f32",
    )  # fmt: skip
    h.send(h.metadata, bytes(buf[:n]))
    n = wire.DataSourceMetaEncoder.encode(
        buf, 0, stream_id=SRC, meta_version=42, timestamp_ns=5,
        attributes=[("serial", "text/plain", b"A-123"), ("gain", "application/json", b"2")],
    )  # fmt: skip
    h.send(h.metadata, bytes(buf[:n]))
    h.pump(until=lambda: h.consumer.meta_version == 42 and h.consumer.source_name == "cam-front")
    assert h.consumer.metadata == {
        "serial": ("text/plain", b"A-123"),
        "gain": ("application/json", b"2"),
    }


def test_s9_udp_progress_republished_with_local_ids(h: Harness) -> None:
    """Forwarded FrameProgress gets dest_stream_id and the local header index, keeps epoch,
    frame id, bytes filled and state, and is published on dest_control_stream_id."""
    h.announce(1)
    h.wait_open()
    got: list[tuple[int, ...]] = []

    def on_local(buffer: object, header: object) -> None:
        got.append(wire.FrameProgressDecoder.decode_tuple(buffer))  # type: ignore[arg-type]

    sub = h.ctx.add_subscription(h.cfg.local.channels.control_channel, 2201, on_local)
    buf = bytearray(64)
    n = wire.FrameProgressEncoder.encode(
        buf, 0, stream_id=SRC, epoch=1, frame_id=70, header_index=999,
        payload_bytes_filled=4096, state=2,
    )  # fmt: skip
    h.send(h.control, bytes(buf[:n]))

    def arrived() -> bool:
        sub.poll()
        return bool(got)

    h.pump(until=arrived)
    stream_id, epoch, frame_id, header_index, filled, state = got[0]
    assert (stream_id, epoch, frame_id, filled, state) == (DEST, 1, 70, 4096, 2)
    assert header_index == 70 & 63  # the destination ring has 64 slots


def test_s9_udp_qos_republished_with_dest_stream_id(h: Harness) -> None:
    """forward_qos: QosProducer/QosConsumer from the bridge control channel are republished
    on dest_control_stream_id with the destination stream id, other fields unchanged."""
    h.announce(1)
    h.wait_open()
    got: list[object] = []

    def on_local(buffer: object, header: object) -> None:
        got.append(wire.QosProducerDecoder().wrap(bytes(buffer)).to_dict())  # type: ignore[call-overload]

    sub = h.ctx.add_subscription(h.cfg.local.channels.control_channel, 2201, on_local)
    buf = bytearray(64)
    n = wire.QosProducerEncoder.encode(
        buf, 0, stream_id=SRC, producer_id=9, epoch=1, current_seq=12345
    )
    h.send(h.control, bytes(buf[:n]))

    def arrived() -> bool:
        sub.poll()
        return bool(got)

    h.pump(until=arrived)
    q = got[0]
    assert q["stream_id"] == DEST  # type: ignore[index]
    assert (q["producer_id"], q["epoch"], q["current_seq"]) == (9, 1, 12345)  # type: ignore[index]


def test_s7_2_udp_source_announce_is_not_republished_locally(h: Harness) -> None:
    """The forwarded ShmPoolAnnounce only feeds validation: nothing about the source stream
    (or its remote region URIs) appears on the local control stream; local consumers see
    the destination's own announce."""
    seen: list[tuple[int, str]] = []

    def on_local(buffer: object, header: object) -> None:
        if peek_header(buffer)[1:3] == (1, 900):  # type: ignore[arg-type]
            d = wire.ShmPoolAnnounceDecoder().wrap(bytes(buffer))  # type: ignore[call-overload]
            seen.append((d.stream_id, d.header_region_uri))

    ch = h.cfg.local.channels
    sub = h.ctx.add_subscription(ch.control_channel, ch.control_stream_id, on_local)
    h.announce(1)
    h.wait_open()

    def announced() -> bool:
        sub.poll()
        return any(sid == DEST for sid, _ in seen)

    h.pump(until=announced)
    h.announce(1)
    h.pump(0.3)
    sub.poll()
    assert all(sid == DEST for sid, _ in seen)
    assert not any("nonexistent" in uri for _, uri in seen)


def test_s6_9_udp_values_len_bytes_kept_as_the_source_wrote_it(h: Harness) -> None:
    """#14.3, Bridge §6.9 / Wire §8.2: the local frame keeps the source's values_len_bytes:
    1500 payload bytes over a 1000-byte tensor arrive as 1500 (all bytes, not cut to the
    extent), and an empty payload (0) with non-zero dims arrives instead of being dropped."""
    h.announce(1)
    h.wait_open()
    wide = TensorLayout.contiguous((500,), np.dtype("<u2"))  # extent 1000
    body = bytes(range(256)) * 5 + bytes(range(220))  # 1500 bytes
    empty = TensorLayout.contiguous((4, 5), np.dtype("<f4"))
    for seq, layout, payload in ((1, wide, body), (2, empty, b"")):
        hdr = header_slot(seq, layout, len(payload), 1_000_000 + seq)
        h.inject(
            Chunker(CHUNK).encode_frame(
                stream_id=SRC, epoch=1, seq=seq, header=hdr, payload=payload
            )
        )
    h.pump(until=lambda: len(h.seen) == 2)
    a, b = h.seen
    assert (a.seq, a.values_len, a.shape, a.data, a.raw) == (1, 1500, (500,), body[:1000], body)
    assert (b.seq, b.values_len, b.shape, b.data, b.raw) == (2, 0, (4, 5), b"", b"")
    assert h.rx()["frame_drops"] == {}
