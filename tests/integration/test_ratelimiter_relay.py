"""One mapping's data path on real SHM and real Aeron (RateLimiter Spec §4, §5, §7).

A standalone source producer writes frames; the relay consumes them, decides with its gate
(driven with explicit `now` values: no wall-clock assertions) and re-materializes into a
standalone destination producer; a real destination consumer checks what arrived. The same
media driver and SHM base directory as the other client integration tests are used.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer, OwnedFrame
from tensorpool.client.producer import FrameClaim, PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.ratelimiter.config import MappingConfig
from tensorpool.ratelimiter.relay import AUTO_SWITCH_LOSSES, MappingRelay, raw_layout
from tensorpool.shm.layout import HEADER_SLOT_BYTES, SUPERBLOCK_SIZE
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import map_region
from tensorpool.shm.seqlock import SlotReader, SlotWriter
from tensorpool.shm.superblock import ExpectedRegion
from tensorpool.shm.tensor import TensorLayout
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SEC = 1_000_000_000
MS = 1_000_000
_ids = itertools.count(100)


@dataclass
class Rig:
    ctx: AeronContext
    src_settings: ClientSettings
    dst_settings: ClientSettings
    source: Producer
    relay: MappingRelay
    dest_consumer: Consumer
    src_id: int
    dst_id: int
    opened: list[Producer] = field(default_factory=list)
    now: int = 0

    def step(self, now: int | None = None, rounds: int = 5) -> None:
        """Let Aeron deliver, then run relay duty cycles at `now`."""
        if now is not None:
            self.now = now
        for _ in range(rounds):
            self.source.do_work()
            self.relay.do_work(self.now)
            time.sleep(0.002)

    def received(self, expect: int, timeout: float = 5.0) -> list[OwnedFrame]:
        out: list[OwnedFrame] = []
        deadline = time.monotonic() + timeout
        while len(out) < expect and time.monotonic() < deadline:
            self.relay.do_work(self.now)
            for f in self.dest_consumer.frames(max_idle_polls=3):
                out.append(f)
            time.sleep(0.002)
        # a little longer, to catch frames that should not be there
        for _ in range(10):
            self.relay.do_work(self.now)
            out.extend(self.dest_consumer.frames(max_idle_polls=2))
            time.sleep(0.002)
        return out

    def publish(self, n: int, nbytes: int = 1024, meta_version: int = 3) -> list[int]:
        seqs = []
        for _ in range(n):
            seq = self.source.next_seq
            arr = np.full(nbytes, seq & 0xFF, np.uint8)
            arr[:8] = np.frombuffer(np.int64(seq).tobytes(), np.uint8)
            assert (
                self.source.offer(arr, timestamp_ns=10_000 + seq, meta_version=meta_version) == seq
            )
            seqs.append(seq)
        return seqs


@pytest.fixture
def rig_factory(media_driver, shm_base) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []
    ctx = AeronContext(TransportConfig(aeron_dir=media_driver.dir)).start()

    def make(
        *,
        rate: int = 10,
        hold: str = "descriptor",
        src_nslots: int = 64,
        dst_nslots: int = 16,
        dst_pools: tuple[PoolConfig, ...] = (PoolConfig(1, 4096), PoolConfig(2, 65536)),
        on_dest_claim: Callable[[], object] | None = None,
    ) -> Rig:
        src_id, dst_id = next(_ids), next(_ids)
        base = 7000 + 10 * src_id
        src = ClientSettings(
            transport=ctx.config,
            channels=Endpoints(
                control_stream_id=base,
                descriptor_stream_id=base + 1,
                qos_stream_id=base + 2,
                metadata_stream_id=base + 3,
            ),
            shm_base_dir=shm_base,
            announce_period_ns=SEC,
        )
        dst = ClientSettings(
            transport=ctx.config,
            channels=Endpoints(
                control_stream_id=base,
                descriptor_stream_id=base + 5,
                qos_stream_id=base + 2,
                metadata_stream_id=base + 3,
            ),
            shm_base_dir=shm_base,
            announce_period_ns=SEC,
        )
        source = Producer(
            ctx,
            StreamConfig(src_id, header_nslots=src_nslots, pools=(PoolConfig(1, 65536),)),
            src,
            instance_id=f"src-{src_id}",
        )
        opened: list[Producer] = []

        def open_dest() -> Producer:
            p = (ClaimHookProducer if on_dest_claim else Producer)(
                ctx,
                StreamConfig(dst_id, header_nslots=dst_nslots, pools=dst_pools),
                dst,
                instance_id=f"dst-{dst_id}",
            )
            if on_dest_claim is not None:
                p.on_claim = on_dest_claim  # type: ignore[attr-defined]
            opened.append(p)
            return p

        relay = MappingRelay(
            MappingConfig(src_id, dst_id, "test", max_rate_hz=rate),
            Consumer(ctx, src_id, src),
            open_dest,
            hold=hold,
            clock=lambda: 0,
        )
        dest_consumer = Consumer(ctx, dst_id, dst)
        rig = Rig(ctx, src, dst, source, relay, dest_consumer, src_id, dst_id, opened)
        deadline = time.monotonic() + 10
        while not (relay.consumer.is_mapped and dest_consumer.is_mapped):
            assert time.monotonic() < deadline, "streams did not map"
            source.do_work()
            rig.step(0, rounds=1)
            if relay.producer is not None:
                relay.producer.do_work()
            dest_consumer.poll(lambda f: None)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.dest_consumer.close()
        rig.relay.close()
        rig.source.close()
        for p in rig.opened:
            p.close()
    ctx.close()


def commit_word(producer: Producer, header_index: int) -> int:
    region = map_region(
        "shm:file?path=" + producer.header_region_path,
        ExpectedRegion.header_ring(
            epoch=producer.epoch,
            stream_id=producer.stream_id,
            nslots=producer.stream.header_nslots,
        ),
        PathPolicy((producer.settings.shm_base_dir,)),
    )
    try:
        return int(region.words[(SUPERBLOCK_SIZE + header_index * HEADER_SLOT_BYTES) >> 3])
    finally:
        region.close()


def test_s4_s5_sequence_identity_gaps_and_preserved_header_fields(rig_factory) -> None:
    """§4 MUST: destination FrameDescriptor.seq == destination seq_commit >> 1 == source seq;
    throttled frames are gaps. §5: timestamp_ns and meta_version preserved, the payload
    copied, pool_id/payload_slot the destination's."""
    rig = rig_factory(rate=10)
    rig.publish(10, meta_version=7)  # seqs 0..9 in one burst: the newest, 9, goes out at once
    rig.step(0)
    rig.publish(10, meta_version=7)  # 10..19, slot closed until 100 ms
    rig.step(50 * MS)
    rig.step(100 * MS)
    frames = rig.received(2)
    assert [f.seq for f in frames] == [9, 19]
    for f in frames:
        assert f.timestamp_ns == 10_000 + f.seq
        assert f.meta_version == 7
        assert int(np.frombuffer(f.array[:8].tobytes(), np.int64)[0]) == f.seq
        assert (f.array[8:] == (f.seq & 0xFF)).all()
    dest = rig.relay.producer
    assert dest is not None
    for f in frames:  # the header slot of the destination ring holds seq << 1 | 1
        assert commit_word(dest, f.seq & 15) == (f.seq << 1) | 1
    assert rig.dest_consumer.drops_gap == 9  # 10..18 never published
    assert rig.relay.gate.stats.superseded >= 17


def test_s5_smallest_destination_stride_that_fits(rig_factory) -> None:
    """§5 step 2: the destination pool is the smallest stride >= payload length."""
    rig = rig_factory(rate=0)
    got: list[tuple[int, int]] = []
    rig.publish(1, nbytes=100)
    rig.publish(1, nbytes=5000)
    rig.publish(1, nbytes=4096)
    rig.step(0)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        rig.dest_consumer.poll(lambda f: got.append((f.values_len_bytes, f.pool_id)))
        time.sleep(0.002)
    assert got == [(100, 1), (5000, 2), (4096, 1)]


def test_s5_oversized_frame_dropped_next_frame_still_flows(rig_factory) -> None:
    """§5 MUST: a payload no destination pool can hold is dropped (counted), never
    truncated; the slot stays open, so the next frame that fits goes out at once."""
    rig = rig_factory(rate=10, dst_pools=(PoolConfig(1, 4096),))
    rig.publish(1, nbytes=8192)
    rig.step(0)
    assert rig.relay.stats.drops["no_pool_fits"] == 1
    rig.publish(1, nbytes=1000)
    rig.step(1 * MS)
    frames = rig.received(1)
    assert [f.seq for f in frames] == [1]


def test_s5_destination_not_claimable_drops_without_blocking(rig_factory) -> None:
    """§5 MUST NOT block: with no destination lease the frame is dropped at once and
    counted; the duty cycle returns and the source keeps being consumed."""
    rig = rig_factory(rate=0)
    assert rig.relay.producer is not None
    rig.relay.producer.close()  # the destination lease/regions are gone
    rig.publish(5)
    t0 = time.monotonic()
    rig.step(0)
    assert time.monotonic() - t0 < 5  # generous: it just must not hang
    assert rig.relay.stats.drops["dest_not_attached"] == 5
    assert rig.relay.gate.stats.offered == 5


def test_s5_destination_ring_overwrite_never_waits_for_readers(rig_factory) -> None:
    """§5 "ring overwrite under load": the rate limiter reuses destination slots without
    waiting for a reader still looking at one; that reader's frame is reported as torn."""
    rig = rig_factory(rate=0, dst_nslots=4)
    rig.publish(1)
    rig.step(0)
    dest = rig.relay.producer
    assert dest is not None
    policy = PathPolicy((rig.dst_settings.shm_base_dir,))
    header = map_region(
        "shm:file?path=" + dest.header_region_path,
        ExpectedRegion.header_ring(epoch=dest.epoch, stream_id=rig.dst_id, nslots=4),
        policy,
    )
    pools = [
        map_region(
            "shm:file?path=" + p,
            ExpectedRegion.payload_pool(
                epoch=dest.epoch,
                stream_id=rig.dst_id,
                pool_id=i + 1,
                nslots=4,
                stride_bytes=s.stride_bytes,
            ),
            policy,
        )
        for i, (p, s) in enumerate(zip(_pool_paths(dest), dest.stream.pools, strict=True))
    ]
    reader = SlotReader(header, pools)
    held = reader.read(0, 0)  # a reader holding frame 0's slot
    assert held is not None
    rig.publish(4)
    rig.step(0)
    assert rig.relay.stats.published == 5  # seqs 1..4, slot 0 reused for seq 4
    assert not reader.is_current(held)
    reader.close()
    for r in (header, *pools):
        r.close()


def _pool_paths(producer: Producer) -> list[str]:
    return [r.path for r in producer._regions[1:]]


def test_s4_most_recent_frame_at_slot_open_relay(rig_factory) -> None:
    """§4 SHOULD, end to end through Aeron: several descriptors queued when the slot opens
    -> the newest one is republished, not the first one after the slot opened."""
    rig = rig_factory(rate=10)
    rig.publish(1)
    rig.step(0)  # seq 0 at once
    rig.publish(6)  # 1..6 while closed
    rig.step(30 * MS)
    time.sleep(0.01)
    rig.publish(3)  # 7..9 after the slot opened, all in Aeron before the relay looks
    rig.step(150 * MS, rounds=1)
    frames = rig.received(2)
    assert [f.seq for f in frames] == [0, 9]


def test_s4_unlimited_republishes_every_frame_in_order(rig_factory) -> None:
    """§4: max_rate_hz = 0 is unlimited: every source frame reaches the destination."""
    rig = rig_factory(rate=0)
    rig.publish(12)
    rig.step(0)
    frames = rig.received(12)
    assert [f.seq for f in frames] == list(range(12))
    assert rig.relay.gate.stats.superseded == 0


def _restart_source(rig: Rig) -> None:
    rig.source.close()
    rig.source = Producer(
        rig.ctx,
        StreamConfig(rig.src_id, header_nslots=64, pools=(PoolConfig(1, 65536),)),
        rig.src_settings,
        instance_id=f"src-{rig.src_id}",
    )


def test_s7_source_epoch_change_is_a_remap_boundary(rig_factory) -> None:
    """§7 MUST: a source epoch change drops the in-flight (pending) frame; §4: the timer
    resets, so the new epoch's first frame is eligible at once; the destination keeps its
    own epoch numbering and moves to a new epoch because the source seq restarted."""
    rig = rig_factory(rate=1)  # 1 s slots: only a reset can explain a second publish
    rig.publish(3)
    rig.step(0)
    rig.publish(2)  # pending (seq 4), slot closed for a second
    rig.step(1 * MS)
    old_src_epoch = rig.relay.source_epoch
    old_dest_epoch = rig.relay.dest_epoch
    assert rig.relay.gate.has_pending
    _restart_source(rig)
    deadline = time.monotonic() + 10
    while rig.relay.source_epoch == old_src_epoch:
        assert time.monotonic() < deadline
        rig.step(2 * MS, rounds=1)
    assert rig.relay.gate.stats.discarded_on_reset >= 1  # seq 4 of the old epoch
    rig.publish(3)  # new epoch, seqs 0..2
    deadline = time.monotonic() + 10
    while rig.relay.stats.published < 2:
        assert time.monotonic() < deadline, rig.relay.stats
        rig.step(3 * MS, rounds=1)
        rig.publish(1)
    assert rig.relay.stats.dest_rollovers == 1
    assert rig.relay.stats.drops["dest_seq_regression"] == 1
    assert rig.relay.dest_epoch > old_dest_epoch
    assert rig.relay.source_epoch is not None and rig.relay.source_epoch > old_src_epoch


def test_hold_descriptor_copies_only_published_frames(rig_factory) -> None:
    """Issue §8: holding the descriptor costs one payload copy per published frame."""
    rig = rig_factory(rate=10, hold="descriptor")
    for t in range(0, 500, 10):
        rig.publish(5)
        rig.step(t * MS, rounds=1)
    rig.step(500 * MS)
    st = rig.relay.stats
    assert st.published >= 5 and st.copies == st.published
    assert rig.relay.gate.stats.offered == 250


def test_hold_copy_copies_every_offered_frame(rig_factory) -> None:
    rig = rig_factory(rate=10, hold="copy")
    for t in range(0, 500, 10):
        rig.publish(5)
        rig.step(t * MS, rounds=1)
    rig.step(500 * MS)
    st = rig.relay.stats
    offered = rig.relay.gate.stats.offered
    assert st.copies == offered + st.published + st.drops["source_torn"], (st, offered)
    assert st.published < offered // 4
    frames = rig.received(st.published)
    dc = rig.dest_consumer
    assert frames, (dc.is_mapped, dc.stats, rig.relay.stats, rig.relay.dest_epoch)
    assert all(int(np.frombuffer(f.array[:8].tobytes(), np.int64)[0]) == f.seq for f in frames)


def _rogue_overwrite(rig: Rig, seqs: range) -> None:
    """Write frames into the source ring *without* descriptors (a second writer on the real
    files): the only way to make a slot change under a pending descriptor on demand."""
    src = rig.source
    policy = PathPolicy((rig.src_settings.shm_base_dir,))
    header = map_region(
        "shm:file?path=" + src.header_region_path,
        ExpectedRegion.header_ring(epoch=src.epoch, stream_id=rig.src_id, nslots=4),
        policy,
        writable=True,
    )
    pool = map_region(
        "shm:file?path=" + _pool_paths(src)[0],
        ExpectedRegion.payload_pool(
            epoch=src.epoch, stream_id=rig.src_id, pool_id=1, nslots=4, stride_bytes=65536
        ),
        policy,
        writable=True,
    )
    writer = SlotWriter(header, [pool])
    for s in seqs:
        writer.write(s, np.zeros(64, np.uint8), timestamp_ns=0)
    writer.close()
    header.close()
    pool.close()


def test_hold_auto_switches_to_copies_when_source_ring_wraps_first(rig_factory) -> None:
    """Issue §8: keep the descriptor and copy at slot open, falling back to a held copy only
    when the source slot gets overwritten before the slot opens (here: a 4-slot ring)."""
    rig = rig_factory(rate=10, hold="auto", src_nslots=4)
    t = 0
    high = 1000
    for _ in range(AUTO_SWITCH_LOSSES):
        rig.publish(1)
        rig.step(t)  # goes out at once: the slot closes for 100 ms
        rig.publish(1)
        rig.step(t + 10 * MS)  # pending
        _rogue_overwrite(rig, range(high, high + 4))  # the pending frame's slot is reused
        high += 4
        rig.step(t + 100 * MS)  # the slot opens: the pending frame is gone
        t += 200 * MS
    assert rig.relay.stats.drops["source_overwritten"] == AUTO_SWITCH_LOSSES
    assert rig.relay.copying and rig.relay.stats.hold_switches == 1
    # Held as a copy now: the same overwrite no longer loses the pending frame.
    rig.publish(1)
    rig.step(t)
    published = rig.relay.stats.published
    (seq,) = rig.publish(1)
    rig.step(t + 10 * MS)
    _rogue_overwrite(rig, range(high, high + 4))
    rig.step(t + 100 * MS)
    assert rig.relay.stats.published == published + 1
    frames = rig.received(1)
    assert frames[-1].seq == seq
    assert int(np.frombuffer(frames[-1].array[:8].tobytes(), np.int64)[0]) == seq


class ClaimHookProducer(Producer):
    """A real destination producer that runs ``on_claim`` right after each claim, i.e. after
    the relay read the source slot and before it copies and re-checks it: the only way to
    make the source slot change *during* the copy on demand (otherwise a race)."""

    on_claim: Callable[[], object] | None = None

    def claim(self, *args: object, **kwargs: object) -> FrameClaim | None:
        claim = super().claim(*args, **kwargs)  # type: ignore[arg-type]
        if self.on_claim is not None:
            self.on_claim()
        return claim


@pytest.mark.parametrize(("rate", "hold"), [(0, "descriptor"), (10, "descriptor")])
def test_s5_1_source_slot_changed_during_copy_is_never_published(
    rig_factory, rate: int, hold: str
) -> None:
    """#14.4, RateLimiter §5.1: after copying the payload the relay re-checks the source slot's
    seqlock; a slot overwritten meanwhile is dropped (``source_torn``) with its destination
    claim left uncommitted, so no torn frame is ever published."""
    pending: list[Callable[[], None]] = []

    def overwrite_once() -> None:
        while pending:
            pending.pop()()

    rig = rig_factory(rate=rate, hold=hold, src_nslots=4, on_dest_claim=overwrite_once)
    rig.publish(1)
    rig.step(0)
    assert [f.seq for f in rig.received(1)] == [0]
    pending.append(lambda: _rogue_overwrite(rig, range(1000, 1004)))
    rig.publish(1)  # seq 1: its slot is overwritten while the relay copies it
    rig.step(100 * MS)
    assert not pending  # the overwrite did happen, during the copy
    assert rig.relay.stats.drops["source_torn"] == 1
    assert rig.relay.stats.published == 1
    assert rig.received(0) == []
    rig.publish(1)  # seq 2 copies cleanly and goes out
    rig.step(200 * MS)
    frames = rig.received(1)
    assert [f.seq for f in frames] == [2]
    assert int(np.frombuffer(frames[0].array[:8].tobytes(), np.int64)[0]) == 2


def write_frame(
    producer: Producer, layout: TensorLayout, values_len: int, payload: bytes, ts: int
) -> int:
    """A source frame whose ``values_len_bytes`` is not the tensor extent (Wire §8.2 allows
    more than the extent, and 0 for an empty payload with non-zero dims)."""
    claim = producer.claim(layout=raw_layout(values_len))
    assert claim is not None
    claim.array[:] = np.frombuffer(payload, np.uint8)
    claim.layout = layout
    seq = producer.commit(claim, timestamp_ns=ts, meta_version=5, values_len_bytes=values_len)
    assert seq is not None
    return seq


@pytest.mark.parametrize(("rate", "hold"), [(0, "descriptor"), (10, "descriptor"), (10, "copy")])
def test_s5_values_len_bytes_arrives_as_the_source_wrote_it(
    rig_factory, rate: int, hold: str
) -> None:
    """#14.3, RateLimiter §5 / Wire §8.2: the relay keeps the source's ``values_len_bytes``:
    1500 over a 1000-byte tensor arrives as 1500 (not the extent) with the tensor's bytes,
    and an empty payload (0) with non-zero dims arrives as such instead of being dropped."""
    rig = rig_factory(rate=rate, hold=hold)
    wide = TensorLayout.contiguous((500,), np.dtype(np.uint16))  # extent 1000
    assert wide.extent_bytes == 1000
    body = bytes(range(256)) * 5 + bytes(220)  # 1500 bytes
    a = write_frame(rig.source, wide, 1500, body, ts=111)
    rig.step(0)
    empty = TensorLayout.contiguous((4, 5), np.dtype(np.float32))
    b = write_frame(rig.source, empty, 0, b"", ts=222)
    rig.step(100 * MS)  # the next slot (rate 10): the empty frame goes out
    got: list[tuple[int, int, tuple[int, ...], bytes, int]] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        rig.relay.do_work(rig.now)
        rig.dest_consumer.poll(
            lambda f: got.append(
                (f.seq, f.values_len_bytes, f.shape, f.array.tobytes(), f.timestamp_ns)
            )
        )
        time.sleep(0.002)
    assert rig.relay.stats.drops.snapshot() == {}
    assert got == [
        (a, 1500, (500,), body[:1000], 111),
        (b, 0, (4, 5), b"", 222),
    ]


def test_s4_s5_1_a_torn_copy_does_not_use_up_the_rate_slot(rig_factory) -> None:
    """#14.4 (mutation check), RateLimiter §4/§5.1: a frame dropped by the seqlock re-check was
    never published, so it does not use up its rate slot: the next frame offered in the same
    slot still goes out at once instead of a period later."""
    pending: list[Callable[[], None]] = []

    def overwrite_once() -> None:
        while pending:
            pending.pop()()

    rig = rig_factory(rate=10, hold="descriptor", src_nslots=4, on_dest_claim=overwrite_once)
    rig.publish(1)
    rig.step(0)
    assert [f.seq for f in rig.received(1)] == [0]
    pending.append(lambda: _rogue_overwrite(rig, range(1000, 1004)))
    rig.publish(1)  # seq 1: torn during the copy at the 100 ms slot
    rig.step(100 * MS)
    assert rig.relay.stats.drops["source_torn"] == 1
    rig.publish(1)  # seq 2, 10 ms later: the 100 ms slot is still unused
    rig.step(110 * MS)
    assert [f.seq for f in rig.received(1)] == [2]
