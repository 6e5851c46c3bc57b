"""The rate limiter agent in-process on real Aeron and real SHM (RateLimiter Spec §4, §6, §6.1).

Sources and destinations are standalone producers here (injected factories), so these tests
exercise the agent's own streams — ConsumerHello, metadata, progress and QoS forwarding —
without a driver daemon; `test_ratelimiter_e2e.py` runs the real processes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tensorpool.client.consumer import MODE_RATE_LIMITED, Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.ratelimiter.agent import RateLimiterAgent
from tensorpool.ratelimiter.config import DriverAccess, MappingConfig, RateLimiterConfig
from tensorpool.specs import decode_any
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

MS = 1_000_000
_ids = itertools.count(1)


class World:
    """Shared streams of one test (distinct Aeron ids per test), source + agent + helpers."""

    def __init__(self, ctx: AeronContext, shm_base: str, n: int, **rl: Any) -> None:
        self.ctx = ctx
        base = 40000 + 20 * n
        self.ids = {"control": base, "desc": base + 1, "qos": base + 2, "meta": base + 3}
        self.src_id, self.dst_id = 30000 + 10 * n, 30001 + 10 * n
        self.dest_desc = base + 4
        self.src = self.settings(shm_base, base + 1)
        self.dst = self.settings(shm_base, self.dest_desc)
        self.source = Producer(
            ctx,
            StreamConfig(
                self.src_id,
                header_nslots=64,
                pools=(PoolConfig(1, 65536),),
                name="detector",
                summary="fast",
            ),
            self.src,
            instance_id=f"agent-src-{n}",
        )
        mapping = MappingConfig(
            self.src_id,
            self.dst_id,
            "test",
            max_rate_hz=rl.pop("mapping_rate", 30),
            metadata_stream_id=rl.pop("metadata_stream_id", 0),
        )
        for key, value in rl.items():
            if value == "shared":  # the test's shared QoS stream, known only now
                rl[key] = self.ids["qos"]
        self.config = RateLimiterConfig(
            instance_id=f"rl-{n}",
            descriptor_channel="aeron:ipc?term-length=16m",
            descriptor_stream_id=self.dest_desc,
            mappings=(mapping,),
            driver=DriverAccess(
                control_stream_id=base,
                descriptor_stream_id=base + 1,
                qos_stream_id=base + 2,
                metadata_stream_id=base + 3,
                shm_base_dir=shm_base,
            ),
            **rl,
        )
        self.dests: list[Producer] = []

        def open_dest(m: MappingConfig) -> Producer:
            p = Producer(
                ctx,
                StreamConfig(m.dest_stream_id, header_nslots=16, pools=(PoolConfig(1, 65536),)),
                self.dst,
                instance_id=f"agent-dst-{n}",
            )
            self.dests.append(p)
            return p

        self.agent = RateLimiterAgent(
            self.config,
            ctx,
            open_source=lambda m: Consumer(ctx, m.source_stream_id, self.src),
            open_dest=open_dest,
        )

    def settings(self, shm_base: str, desc: int) -> ClientSettings:
        return ClientSettings(
            transport=self.ctx.config,
            channels=Endpoints(
                control_stream_id=self.ids["control"],
                descriptor_stream_id=desc,
                qos_stream_id=self.ids["qos"],
                metadata_stream_id=self.ids["meta"],
            ),
            shm_base_dir=shm_base,
            announce_period_ns=1000 * MS,
            qos_period_ns=100 * MS,
        )

    def spin(self, until: Callable[[], bool], timeout: float = 10.0, *extra: Any) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, self.agent.snapshot()
            self.source.do_work()
            self.agent.do_work()
            for c in extra:
                c.poll(lambda f: None)
            time.sleep(0.002)

    def close(self) -> None:
        self.agent.close()
        self.source.close()
        for p in self.dests:
            p.close()


@pytest.fixture
def world(media_driver, shm_base) -> Iterator[Callable[..., World]]:
    ctx = AeronContext(TransportConfig(aeron_dir=media_driver.dir)).start()
    made: list[World] = []

    def make(**rl: Any) -> World:
        w = World(ctx, shm_base, next(_ids), **rl)
        made.append(w)
        w.spin(lambda: w.agent.relays[0].consumer.is_mapped)
        return w

    yield make
    for w in made:
        w.close()
    ctx.close()


def test_s4_consumer_hello_rate_overrides_config_then_zero_is_unlimited(world) -> None:
    """§4 MUST: the destination consumer's ConsumerHello.max_rate_hz (RATE_LIMITED) is the
    rate, over the mapping's; 0 means unlimited; a STREAM consumer's hello changes nothing."""
    w = world(mapping_rate=30)
    gate = w.agent.relays[0].gate
    assert gate.rate_hz == 30
    stream_consumer = Consumer(w.ctx, w.dst_id, w.dst)  # STREAM mode, says max_rate_hz=0
    w.spin(lambda: stream_consumer.is_mapped, 10, stream_consumer)
    assert gate.rate_hz == 30 and gate.hello_rate_hz is None
    gui = Consumer(w.ctx, w.dst_id, w.dst, mode=MODE_RATE_LIMITED, max_rate_hz=5)
    w.spin(lambda: gate.rate_hz == 5, 10, gui)
    assert w.agent.snapshot()["mappings"][0]["hello_rate_hz"] == 5
    fast = Consumer(w.ctx, w.dst_id, w.dst, mode=MODE_RATE_LIMITED, max_rate_hz=0)
    w.spin(lambda: gate.rate_hz == 0, 10, fast)
    # Unlimited: every source frame goes through.
    before = w.agent.relays[0].stats.published
    for _ in range(20):
        w.source.offer(np.zeros(64, np.uint8))
    w.spin(lambda: w.agent.relays[0].stats.published >= before + 20)
    for c in (stream_consumer, gui, fast):
        c.close()


def test_s6_metadata_forwarded_with_rewritten_stream_id_and_same_version(world) -> None:
    """§6 MUST: forward_metadata forwards DataSourceAnnounce and DataSourceMeta; the
    destination consumer sees the source's attributes under the source's meta_version."""
    w = world()
    version = w.source.set_metadata({"gain": "2.5", "units": "counts"})
    w.source.set_metadata({"gain": "3.0", "units": "counts"})  # version + 1
    version += 1
    dest = Consumer(w.ctx, w.dst_id, w.dst)
    w.spin(lambda: dest.meta_version == version and dest.source_name == "detector", 10, dest)
    assert dest.metadata["gain"] == ("text/plain", b"3.0")
    assert dest.metadata["units"] == ("text/plain", b"counts")
    assert w.agent.forwarder is not None and w.agent.forwarder.forwarded["meta"] >= 1
    dest.close()


class Tap:
    """A raw subscription that decodes everything on one Aeron stream."""

    def __init__(self, ctx: AeronContext, stream_id: int) -> None:
        self.seen: list[Any] = []
        self.sub = ctx.add_subscription(
            "aeron:ipc", stream_id, lambda b, h: self.seen.append(decode_any(bytes(b)))
        )

    def of(self, cls: type) -> list[Any]:
        while self.sub.poll():
            pass
        return [m for m in self.seen if isinstance(m, cls)]


def test_s6_metadata_stream_id_configured(world) -> None:
    """§6 MUST: with metadata_stream_id set, metadata is published with that stream_id."""
    w = world(metadata_stream_id=39999)
    tap = Tap(w.ctx, w.ids["meta"])
    w.source.set_metadata({"k": "v"})
    v = w.source.meta_version

    def forwarded() -> list[Any]:
        return [
            m
            for m in tap.of(wire.DataSourceMetaDecoder)
            if m.stream_id == 39999 and m.meta_version == v
        ]

    w.spin(lambda: bool(forwarded()))
    assert not [m for m in tap.of(wire.DataSourceMetaDecoder) if m.stream_id == w.dst_id]


def test_s6_1_progress_forwarded_to_dest_control_stream(world) -> None:
    """§6.1: with forward_progress, FrameProgress read on source_control_stream_id is
    republished on dest_control_stream_id with streamId -> destination and headerIndex in
    the destination ring (16 slots here)."""
    w = world(
        forward_progress=True,
        control_channel="aeron:ipc",
        source_control_stream_id=48001,
        dest_control_stream_id=48002,
    )
    tap = Tap(w.ctx, 48002)
    pub = w.ctx.add_publication("aeron:ipc", 48001)
    src_epoch = w.agent.relays[0].consumer.epoch
    buf = bytearray(64)
    n = wire.FrameProgressEncoder.encode(
        buf,
        0,
        stream_id=w.src_id,
        epoch=src_epoch,
        frame_id=45,
        header_index=45 & 63,
        payload_bytes_filled=100,
        state=int(wire.FrameProgressState.STARTED),
    )

    def got() -> list[Any]:
        return tap.of(wire.FrameProgressDecoder)

    deadline = time.monotonic() + 10
    while not got():
        assert time.monotonic() < deadline, w.agent.snapshot()
        pub.offer(buf, 0, n)
        for _ in range(5):
            w.agent.do_work()
            time.sleep(0.002)
    p = got()[0]
    assert p.stream_id == w.dst_id and p.header_index == 45 & 15 and p.frame_id == 45
    assert p.epoch == w.agent.relays[0].dest_epoch
    pub.close()


def test_s6_1_qos_forwarded_with_rewritten_stream_id(world) -> None:
    """§6.1: with forward_qos, the source's QosProducer/QosConsumer (read on the shared QoS
    stream) are republished on dest_qos_stream_id with streamId -> destination."""
    w = world(
        forward_qos=True,
        qos_channel="aeron:ipc",
        source_qos_stream_id="shared",
        dest_qos_stream_id=48012,
    )
    tap = Tap(w.ctx, 48012)

    def producers() -> list[Any]:
        return [q for q in tap.of(wire.QosProducerDecoder) if q.stream_id == w.dst_id]

    def consumers() -> list[Any]:
        return [q for q in tap.of(wire.QosConsumerDecoder) if q.stream_id == w.dst_id]

    w.spin(lambda: bool(producers()) and bool(consumers()))
    q = producers()[-1]
    assert q.epoch == w.source.epoch  # preserved: the source producer's own report
    c = consumers()[-1]
    assert c.consumer_id == w.agent.relays[0].consumer.consumer_id
    assert not [m for m in tap.of(wire.QosProducerDecoder) if m.stream_id == w.src_id]


def test_s3_never_publishes_descriptors_for_the_source_stream(world) -> None:
    """§3 MUST NOT / MUST: every FrameDescriptor of the source stream comes from the source
    producer; the rate limiter's descriptors all name the destination stream."""
    w = world(mapping_rate=0)
    src_tap = Tap(w.ctx, w.ids["desc"])
    dst_tap = Tap(w.ctx, w.dest_desc)
    for _ in range(30):
        w.source.offer(np.zeros(256, np.uint8))
    w.spin(lambda: w.agent.relays[0].stats.published >= 30)
    deadline = time.monotonic() + 5
    while len(dst_tap.of(wire.FrameDescriptorDecoder)) < 30 and time.monotonic() < deadline:
        time.sleep(0.01)
    src_desc = src_tap.of(wire.FrameDescriptorDecoder)
    dst_desc = dst_tap.of(wire.FrameDescriptorDecoder)
    assert len([d for d in src_desc if d.stream_id == w.src_id]) == w.source.stats.frames
    assert not [d for d in src_desc if d.stream_id == w.dst_id]
    assert len(dst_desc) >= 30 and {d.stream_id for d in dst_desc} == {w.dst_id}


def test_s6_forward_metadata_false_forwards_nothing(world) -> None:
    """§6: with forward_metadata = false the source's metadata is not republished."""
    w = world(forward_metadata=False)
    tap = Tap(w.ctx, w.ids["meta"])
    w.source.set_metadata({"k": "v"})
    w.spin(lambda: bool(tap.of(wire.DataSourceMetaDecoder)))  # the source's own message
    for _ in range(50):
        w.agent.do_work()
        time.sleep(0.002)
    metas = tap.of(wire.DataSourceMetaDecoder)
    assert {m.stream_id for m in metas} == {w.src_id}
    assert w.agent.forwarder is not None and w.agent.forwarder.forwarded["meta"] == 0
