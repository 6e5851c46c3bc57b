"""Metadata, progress and QoS forwarding without I/O (RateLimiter Spec §6, §6.1): real wire
encodings in, real wire encodings out, decoded with the generated decoders."""

from __future__ import annotations

import pytest

from tensorpool.ratelimiter.forward import Forwarder, Route
from tensorpool.specs.generated import wire

SRC, DEST, META = 10000, 20000, 20500


def route(*, meta: int = DEST, attached: bool = True) -> Route:
    r = Route(SRC, DEST, meta, source_epoch=7)
    if attached:
        r.dest_epoch, r.dest_producer_id, r.dest_nslots = 3, 99, 16
    return r


def announce(stream_id: int = SRC, meta_version: int = 5) -> bytes:
    buf = bytearray(512)
    n = wire.DataSourceAnnounceEncoder.encode(
        buf,
        0,
        stream_id=stream_id,
        producer_id=11,
        epoch=7,
        meta_version=meta_version,
        name="detector",
        summary="1 kHz",
    )
    return bytes(buf[:n])


def meta(stream_id: int = SRC, meta_version: int = 5) -> bytes:
    buf = bytearray(512)
    n = wire.DataSourceMetaEncoder.encode(
        buf,
        0,
        stream_id=stream_id,
        meta_version=meta_version,
        timestamp_ns=123,
        attributes=[("gain", "text/plain", b"2.5"), ("raw", "application/octet-stream", b"\0\1")],
    )
    return bytes(buf[:n])


def progress(stream_id: int = SRC, epoch: int = 7, frame_id: int = 37) -> bytes:
    buf = bytearray(64)
    n = wire.FrameProgressEncoder.encode(
        buf,
        0,
        stream_id=stream_id,
        epoch=epoch,
        frame_id=frame_id,
        header_index=frame_id & 63,  # the source ring has 64 slots
        payload_bytes_filled=4096,
        state=int(wire.FrameProgressState.PROGRESS),
    )
    return bytes(buf[:n])


def test_s6_metadata_forwarded_with_dest_stream_id_and_same_version() -> None:
    """§6 MUST: DataSourceAnnounce/DataSourceMeta forwarded, meta_version preserved,
    stream_id rewritten to the destination stream."""
    fwd = Forwarder([route()])
    r, data = fwd.metadata(announce(meta_version=5))  # type: ignore[misc]
    a = wire.DataSourceAnnounceDecoder().wrap(bytes(data))
    assert (a.stream_id, a.meta_version, a.name, a.summary) == (DEST, 5, "detector", "1 kHz")
    assert (a.epoch, a.producer_id) == (3, 99)  # the destination's own epoch (§7)
    r, data = fwd.metadata(meta(meta_version=5))  # type: ignore[misc]
    m = wire.DataSourceMetaDecoder().wrap(bytes(data))
    assert (m.stream_id, m.meta_version, m.timestamp_ns) == (DEST, 5, 123)
    assert [(x.key, x.format, bytes(x.value)) for x in m.attributes] == [
        ("gain", "text/plain", b"2.5"),
        ("raw", "application/octet-stream", b"\0\1"),
    ]
    assert r.meta_version == 5 and r.name == "detector"
    assert fwd.forwarded["announce"] == fwd.forwarded["meta"] == 1


def test_s6_metadata_stream_id_configured_is_used() -> None:
    """§6 MUST: with metadata_stream_id configured, forwarded metadata carries that id."""
    fwd = Forwarder([route(meta=META)])
    _, data = fwd.metadata(meta())  # type: ignore[misc]
    assert wire.DataSourceMetaDecoder().wrap(bytes(data)).stream_id == META
    _, data = fwd.metadata(announce())  # type: ignore[misc]
    assert wire.DataSourceAnnounceDecoder().wrap(bytes(data)).stream_id == META


def test_s6_metadata_of_other_streams_is_ignored() -> None:
    fwd = Forwarder([route()])
    assert fwd.metadata(meta(stream_id=4242)) is None
    assert fwd.metadata(meta(stream_id=DEST)) is None  # our own output echoed back
    assert fwd.counters.total() == 0


def test_s6_metadata_held_until_destination_attached_then_replayed() -> None:
    """Metadata seen before the destination has an epoch is kept and replayed on attach, so
    a destination consumer does not wait a source period (versions still preserved)."""
    r = route(attached=False)
    fwd = Forwarder([r])
    assert fwd.metadata(announce(meta_version=8)) is None
    assert fwd.metadata(meta(meta_version=8)) is None
    assert fwd.counters["metadata_held_until_attached"] == 2
    r.dest_epoch, r.dest_producer_id, r.dest_nslots = 4, 1, 8
    out = [bytes(x) for x in fwd.replay(r)]
    assert len(out) == 2
    a = wire.DataSourceAnnounceDecoder().wrap(out[0])
    m = wire.DataSourceMetaDecoder().wrap(out[1])
    assert (a.stream_id, a.epoch, a.meta_version) == (DEST, 4, 8)
    assert (m.stream_id, m.meta_version) == (DEST, 8)


def test_s6_newer_version_tracked_older_still_forwarded_verbatim() -> None:
    """Versions are forwarded as they are (never bumped or reordered by the rate limiter)."""
    r = route()
    fwd = Forwarder([r])
    fwd.metadata(meta(meta_version=9))
    _, data = fwd.metadata(meta(meta_version=4))  # type: ignore[misc]
    assert wire.DataSourceMetaDecoder().wrap(bytes(data)).meta_version == 4
    assert r.meta_version == 9


def test_s6_1_progress_rewritten_to_destination_ring() -> None:
    """§6.1 MUST: FrameProgress.streamId -> destination, headerIndex -> destination ring slot
    (the destination writes seq s at s & (nslots-1)); frameId (= seq) kept."""
    fwd = Forwarder([route()])  # destination ring: 16 slots
    data = fwd.progress(progress(frame_id=37))
    assert data is not None
    p = wire.FrameProgressDecoder().wrap(bytes(data))
    assert p.stream_id == DEST
    assert p.header_index == 37 & 15 == 5
    assert p.frame_id == 37 and p.epoch == 3
    assert p.payload_bytes_filled == 4096 and p.state == wire.FrameProgressState.PROGRESS


@pytest.mark.parametrize(
    ("r", "msg", "reason"),
    [
        (route(attached=False), progress(), "progress_dest_not_attached"),
        (route(), progress(epoch=6), "progress_stale_epoch"),
        (Route(SRC, DEST, DEST, dest_nslots=8), progress(), "progress_source_not_mapped"),
    ],
)
def test_s6_1_progress_dropped_when_it_cannot_refer_to_the_destination(
    r: Route, msg: bytes, reason: str
) -> None:
    fwd = Forwarder([r])
    assert fwd.progress(msg) is None
    assert fwd.counters[reason] == 1


def test_s6_1_qos_rewritten_other_fields_preserved() -> None:
    """§6.1: QosProducer/QosConsumer streamId -> destination; other fields preserved."""
    fwd = Forwarder([route()])
    buf = bytearray(128)
    n = wire.QosConsumerEncoder.encode(
        buf,
        0,
        stream_id=SRC,
        consumer_id=5,
        epoch=7,
        last_seq_seen=1000,
        drops_gap=3,
        drops_late=2,
        mode=int(wire.Mode.STREAM),
    )
    data = fwd.qos(bytes(buf[:n]))
    c = wire.QosConsumerDecoder().wrap(bytes(data))  # type: ignore[arg-type]
    assert (c.stream_id, c.consumer_id, c.epoch, c.last_seq_seen) == (DEST, 5, 7, 1000)
    assert (c.drops_gap, c.drops_late, c.mode) == (3, 2, wire.Mode.STREAM)
    n = wire.QosProducerEncoder.encode(
        buf, 0, stream_id=SRC, producer_id=4, epoch=7, current_seq=1001, watermark=77
    )
    data = fwd.qos(bytes(buf[:n]))
    q = wire.QosProducerDecoder().wrap(bytes(data))  # type: ignore[arg-type]
    assert (q.stream_id, q.producer_id, q.epoch, q.current_seq, q.watermark) == (
        DEST,
        4,
        7,
        1001,
        77,
    )
    assert fwd.forwarded["qos_consumer"] == fwd.forwarded["qos_producer"] == 1


def test_forwarding_never_raises_on_garbage() -> None:
    """Bad input is counted, never raised: truncated, foreign, and lying messages."""
    fwd = Forwarder([route()])
    good = bytearray(meta())
    truncated = bytes(good[:20])
    lying = bytearray(good)
    lying[-5:-3] = b"\xff\xff"  # a var-data length running past the end
    for fn in (fwd.metadata, fwd.progress, fwd.qos):
        assert fn(b"") is None
        assert fn(b"\x01\x02\x03") is None
        assert fn(truncated) is None
        assert fn(bytes(lying)) is None
        assert fn(progress()[:30]) is None
    assert fwd.counters.total() > 0


def test_s6_1_mappings_share_streams_disambiguated_by_stream_id() -> None:
    """§6.1: all mappings share the control/QoS streams; each forwarded message names its own
    destination, chosen by the source streamId it came with."""
    a = route()
    b = Route(SRC + 1, DEST + 1, DEST + 1, source_epoch=2, dest_epoch=9, dest_nslots=4)
    fwd = Forwarder([a, b])
    pa = wire.FrameProgressDecoder().wrap(bytes(fwd.progress(progress(SRC, 7, 10))))  # type: ignore[arg-type]
    pb = wire.FrameProgressDecoder().wrap(bytes(fwd.progress(progress(SRC + 1, 2, 10))))  # type: ignore[arg-type]
    assert (pa.stream_id, pa.header_index, pa.epoch) == (DEST, 10 & 15, 3)
    assert (pb.stream_id, pb.header_index, pb.epoch) == (DEST + 1, 10 & 3, 9)
