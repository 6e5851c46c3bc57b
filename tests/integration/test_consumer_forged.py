"""Forged and stale control messages against a running consumer (#14 section 2).

Aeron IPC has no sender identity: any process that can write the Aeron directory can
publish on the control and descriptor streams. Each test runs a real producer and consumer
over a real media driver and real SHM files, publishes one forged but validly encoded SBE
message (or rewrites a superblock field, for §15.1/§15.14) and checks that no good frame is
lost and the counters stay meaningful.

Frames are produced in lockstep (each one must arrive before the next is offered) and the
producer does *not* announce during a burst: a consumer that dropped its mapping would get
no frame until the next announce, so a lost or delayed frame shows as a missing seq.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

NSLOTS = 16
# One stream id per test: the media driver is shared by the module, and a test's forged
# messages must not reach the next test's consumer.
_STREAMS = itertools.count(31)
_SB = wire.ShmRegionSuperblockDecoder


@dataclass
class Rig:
    ctx: AeronContext
    stream: int
    settings: ClientSettings
    producer: Producer
    consumer: Consumer
    control: object  # forged control-stream publication
    descriptors: object  # forged descriptor-stream publication
    seqs: list[int]

    def take(self, frame: Frame) -> None:
        if frame.is_current():
            self.seqs.append(frame.seq)

    def poll_until(self, cond, what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.producer.do_work()
            self.consumer.poll(self.take)
            time.sleep(0.001)

    def burst(self, n: int, timeout: float = 10.0) -> list[int]:
        """Offer ``n`` frames one at a time; each must be delivered before the next."""
        got: list[int] = []
        for _ in range(n):
            seq = self.producer.offer(np.zeros(16, np.int32))
            assert seq is not None
            deadline = time.monotonic() + timeout
            while seq not in self.seqs:
                assert time.monotonic() < deadline, (
                    f"frame {seq} never delivered: mapped={self.consumer.is_mapped} "
                    f"control={self.consumer.stats.control.snapshot()} "
                    f"drops={self.consumer.stats.drops.snapshot()}"
                )
                self.consumer.poll(self.take)
            got.append(seq)
        return got

    def inject(self, pub: object, payload: bytes, until, what: str) -> None:
        deadline = time.monotonic() + 10
        while not pub.offer(payload):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.001)
        deadline = time.monotonic() + 10
        while not until():
            assert time.monotonic() < deadline, f"forged message never processed: {what}"
            self.consumer.poll(self.take)
            time.sleep(0.0005)


def _settings(media_driver, shm_base: str, period_ns: int) -> ClientSettings:
    return ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=period_ns,
    )


@pytest.fixture
def rig(media_driver, shm_base) -> Iterator[Rig]:
    settings = _settings(media_driver, shm_base, 200_000_000)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        stream = next(_STREAMS)
        cfg = StreamConfig.for_frame_bytes(stream, 64, header_nslots=NSLOTS)
        producer = Producer(ctx, cfg, settings)
        consumer = Consumer(ctx, stream, settings)
        ch = settings.channels
        control = ctx.add_publication(ch.control_channel, ch.control_stream_id)
        descriptors = ctx.add_publication(ch.descriptor_channel, ch.descriptor_stream_id)
        r = Rig(ctx, stream, settings, producer, consumer, control, descriptors, [])
        try:
            assert control.await_connected(10) and descriptors.await_connected(10)
            r.poll_until(lambda: consumer.is_mapped, "the first mapping")
            r.burst(3)
            yield r
        finally:
            consumer.close()
            producer.close()
            if r.producer is not producer:  # a test restarted it
                r.producer.close()


def _announce(stream: int, epoch: int, path: str) -> bytes:
    buf = bytearray(4096)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=stream,
        producer_id=666,
        epoch=epoch,
        announce_timestamp_ns=time.monotonic_ns(),
        announce_clock_domain=1,
        layout_version=1,
        header_nslots=NSLOTS,
        header_slot_bytes=256,
        payload_pools=[(1, NSLOTS, 4096, f"shm:file?path={path}.pool")],
        header_region_uri=f"shm:file?path={path}",
    )
    return bytes(buf[:n])


def _descriptor(stream: int, epoch: int, seq: int) -> bytes:
    buf = bytearray(256)
    n = wire.FrameDescriptorEncoder.encode(
        buf,
        0,
        stream_id=stream,
        epoch=epoch,
        seq=seq,
        header_index=seq & (NSLOTS - 1),
        timestamp_ns=0,
        meta_version=0,
    )
    return bytes(buf[:n])


def _header_path(consumer: Consumer) -> str:
    layout = consumer.layout
    assert layout is not None
    return layout.header_region_uri.split("path=", 1)[1]


def _contiguous(seqs: list[int]) -> bool:
    return seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_14_2_bogus_higher_epoch_announce_costs_no_frame(rig: Rig) -> None:
    """#14 §2: a ShmPoolAnnounce with a higher epoch and a bad path is validated (and fails)
    while the current mapping keeps serving: every frame after it arrives, no remap."""
    c = rig.consumer
    epoch = c.epoch
    bad = os.path.join(rig.settings.shm_base_dir, "forged", "header.ring")
    rig.inject(
        rig.control,
        _announce(rig.stream, epoch + 10, bad),  # type: ignore[operator]
        lambda: c.stats.control["path_not_found"] >= 1,
        "bogus announce",
    )
    assert c.is_mapped and c.epoch == epoch
    got = rig.burst(3 * NSLOTS)
    assert _contiguous(rig.seqs) and got[-1] == rig.seqs[-1]
    assert c.stats.remaps == 1 and c.drops_gap == 0 and c.drops_late == 0


@pytest.mark.parametrize(("seq", "reason"), [(0, "seq_stale"), (2**62, "seq_implausible")])
def test_14_2_forged_descriptor_seq_neither_remaps_nor_poisons_counters(
    rig: Rig, seq: int, reason: str
) -> None:
    """#14 §2: a FrameDescriptor with seq 0 or 2**62 for the mapped epoch is dropped and
    counted; no remap, ``drops_gap`` stays meaningful (0 here), every real frame arrives."""
    c = rig.consumer
    rig.burst(NSLOTS + 2)  # the ring wrapped: seq 0's slot holds a newer frame
    rig.inject(
        rig.descriptors,
        _descriptor(rig.stream, c.epoch, seq),  # type: ignore[arg-type]
        lambda: c.stats.drops[reason] >= 1,
        f"descriptor seq {seq}",
    )
    rig.burst(2 * NSLOTS)
    assert _contiguous(rig.seqs)
    assert c.stats.remaps == 1 and c.drops_gap == 0 and c.drops_late == 0
    assert c.stats.drops[reason] == 1


def test_s10_2_1_descriptor_of_an_older_epoch_is_ignored(rig: Rig) -> None:
    """Wire §10.2.1: a descriptor whose epoch is not the mapped one (a stale in-flight one of
    the previous epoch) is ignored and counted -- even for the very next seq."""
    c = rig.consumer
    nxt = rig.seqs[-1] + 1
    rig.inject(
        rig.descriptors,
        _descriptor(rig.stream, c.epoch - 1, nxt),  # type: ignore[operator]
        lambda: c.stats.drops["epoch_mismatch"] >= 1,
        "stale-epoch descriptor",
    )
    rig.burst(NSLOTS)
    assert _contiguous(rig.seqs) and c.drops_gap == 0 and c.drops_late == 0
    assert c.stats.drops.get("seq_implausible") == 0


def _rewrite_superblock(path: str, offset: int, value: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, value.to_bytes(8, "little"), offset)
    finally:
        os.close(fd)


def test_s15_14_superblock_pid_change_unmaps_and_waits_for_a_new_epoch(
    rig: Rig, media_driver
) -> None:
    """§15.14: "if pid changes ... consumers MUST unmap and wait for a new epoch": checked on
    the next announce; announces of that epoch no longer map; the producer's next epoch does."""
    c = rig.consumer
    epoch = c.epoch
    _rewrite_superblock(_header_path(c), _SB.PID_OFFSET, 1)
    rig.poll_until(lambda: not c.is_mapped, "the pid-change unmap")
    assert c.stats.control["superblock_pid_changed"] == 1
    rig.poll_until(lambda: c.stats.control["announce_old_epoch"] >= 2, "two more announces")
    assert not c.is_mapped
    rig.producer.close()  # a restart: the producer's next epoch
    rig.producer = Producer(
        rig.ctx, StreamConfig.for_frame_bytes(rig.stream, 64, header_nslots=NSLOTS), rig.settings
    )
    rig.poll_until(lambda: c.is_mapped, "the new epoch")
    assert c.epoch is not None and c.epoch > epoch  # type: ignore[operator]
    rig.burst(4)


def test_s15_1_superblock_magic_checked_on_every_announce(rig: Rig) -> None:
    """§15.1: magic (and epoch) are validated on every ShmPoolAnnounce, not only when
    mapping: a header ring whose magic changed under a mapping is unmapped on the next."""
    c = rig.consumer
    _rewrite_superblock(_header_path(c), _SB.MAGIC_OFFSET, 0x0BAD0BAD0BAD0BAD)
    rig.poll_until(lambda: not c.is_mapped, "the magic-change unmap")
    assert c.stats.control["superblock_magic_changed"] == 1


def test_14_2_joining_a_running_stream_counts_only_frames_after_the_join(
    media_driver, shm_base
) -> None:
    """#14 §2: descriptors published between the consumer's subscription and its mapping
    (queued in the log, their slots long overwritten) are not gaps."""
    settings = _settings(media_driver, shm_base, 1_000_000_000)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        stream = next(_STREAMS)
        cfg = StreamConfig.for_frame_bytes(stream, 64, header_nslots=NSLOTS)
        producer = Producer(ctx, cfg, settings)
        producer.do_work()  # the first announce goes out now: the next one is a period away
        consumer = Consumer(ctx, stream, settings)
        r = Rig(ctx, stream, settings, producer, consumer, None, None, [])
        try:
            # the stream runs on while the consumer is subscribed but not yet mapped (it has not
            # polled its control stream yet): these descriptors queue in its log
            for _ in range(4 * NSLOTS):
                producer.offer(np.zeros(16, np.int32))
            r.poll_until(lambda: consumer.is_mapped, "the mapping")
            r.burst(2 * NSLOTS)
            queued = consumer.stats.drops["before_join"]
            assert queued > NSLOTS, consumer.stats.drops.snapshot()  # the scenario happened
            assert consumer.drops_gap == 0 and consumer.drops_late == 0
            assert _contiguous(r.seqs)
        finally:
            consumer.close()
            producer.close()
