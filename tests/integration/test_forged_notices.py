"""#14 §2: forged `ShmDriverShutdown` / `ShmLeaseRevoked` do not take clients out.

Aeron IPC has no sender identity: any process that can write the Aeron directory can publish
on the driver's control stream. The default deployment runs here: the `tensorpool driver`
daemon hosting its embedded media driver, as a real subprocess; a producer and a consumer in
driver mode attach through it in this process. A third Aeron client (the forger) publishes a
validly encoded `ShmDriverShutdown`, then a `ShmLeaseRevoked` naming the producer's lease.
Each client confirms the notice with the driver before acting on it (client/lease.py):
the driver still holds both leases, so the producer keeps producing, without a gap, at the
same epoch and lease, and the consumer keeps its lease.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
from driver_fixtures import (
    ControlClient,
    DriverProcess,
    embedded_driver_work,
    read_status,
)

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.specs import decode_any
from tensorpool.specs.generated import driver as dp
from tensorpool.specs.generated import wire
from tensorpool.transport.clock import now_ns
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

pytestmark = pytest.mark.slow

CONTROL = "aeron:ipc?term-length=4m"
CONTROL_STREAM = 1000
STREAM = 10000
WAIT = 30.0


@pytest.fixture
def work() -> Iterator[dict[str, str]]:
    with embedded_driver_work("tp-forged-", CONTROL) as paths:
        yield paths


def _forged_shutdown() -> bytes:
    buf = bytearray(256)
    n = dp.ShmDriverShutdownEncoder.encode(
        buf, 0, timestamp_ns=now_ns(), reason=dp.ShutdownReason.ADMIN, error_message="forged"
    )
    return bytes(buf[:n])


def _forged_revoke(lease_id: int, client_id: int) -> bytes:
    buf = bytearray(256)
    n = dp.ShmLeaseRevokedEncoder.encode(
        buf,
        0,
        timestamp_ns=now_ns(),
        lease_id=lease_id,
        stream_id=STREAM,
        client_id=client_id,
        role=dp.Role.PRODUCER,
        reason=dp.LeaseRevokeReason.REVOKED,
        error_message="forged",
    )
    return bytes(buf[:n])


def _driver_leases(base: str) -> set[int]:
    """The lease ids in the daemon's status file, once it was rewritten after this call."""
    first = read_status(base)
    assert first is not None
    deadline = time.monotonic() + WAIT
    while True:
        doc = read_status(base)
        if doc is not None and doc["written_unix_ns"] > first["written_unix_ns"]:
            return {int(row["lease_id"]) for row in doc["leases"]}
        assert time.monotonic() < deadline, "the driver stopped writing its status file"
        time.sleep(0.05)


def test_14_2_forged_shutdown_and_revoke_cost_no_frame_and_no_lease(work: dict[str, str]) -> None:
    """#14 §2: after a forged ShmDriverShutdown and a forged ShmLeaseRevoked (producer lease),
    the producer wrote every frame (consecutive seqs, no `no_lease` drop) at its first epoch
    and lease, the consumer kept its lease and received frames after each forgery, and each
    client counted the contradicted notice."""
    daemon = DriverProcess(work["config"], work["base"], os.path.join(work["root"], "d.log"))
    daemon.start().wait_ready(WAIT)
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=work["aeron"]),
        channels=Endpoints(control_channel=CONTROL, control_stream_id=CONTROL_STREAM),
        shm_base_dir=work["base"],
        announce_period_ns=200_000_000,
    )
    ctx = AeronContext(settings.transport)
    forger: ControlClient | None = None
    try:
        ctx.start()
        producer = Producer(ctx, STREAM, settings, driver=True)
        producer.wait_until_attached(WAIT)
        consumer = Consumer(ctx, STREAM, settings, driver=True)
        forger = ControlClient(work["aeron"], channel=CONTROL, stream_id=CONTROL_STREAM)
        got: list[tuple[int, int]] = []

        def on_frame(frame: Frame) -> None:
            got.append((frame.epoch, frame.seq))

        frame = np.arange(64, dtype=np.uint8)
        seqs: list[int | None] = []

        def run(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                seqs.append(producer.offer(frame))
                producer.do_work()
                consumer.poll(on_frame)
                time.sleep(0.002)

        deadline = time.monotonic() + WAIT
        while not got and time.monotonic() < deadline:  # the consumer is attached and mapped
            run(0.05)
        assert got, consumer.stats.control.snapshot()
        epoch, lease = producer.epoch, producer.lease_id
        assert lease is not None
        leases = _driver_leases(work["base"])
        assert len(leases) == 2 and lease in leases  # the producer's and the consumer's

        forger.send(_forged_shutdown())
        n_before = len(got)
        run(1.5)  # three confirmation windows
        assert len(got) > n_before, "the consumer stopped receiving after a forged shutdown"

        forger.send(_forged_revoke(lease, producer.producer_id))
        run(1.5)

        assert producer.epoch == epoch and producer.lease_id == lease
        assert _driver_leases(work["base"]) == leases  # the driver's view: the same two leases
        assert None not in seqs, "the producer dropped frames (no lease) after a forged notice"
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the producer's seqs"
        assert producer.stats.drops.snapshot().get("no_lease", 0) == 0
        assert producer.lease_counters.get("notice_not_confirmed") == 2
        assert consumer.stats.control.snapshot().get("lease_lost", 0) == 0
        assert all(e == epoch for e, _ in got)
    finally:
        if forger is not None:
            forger.close()
        ctx.close()  # before the daemon takes its media driver away
        daemon.stop()


def test_28_4_frames_lost_to_a_forged_revoke_are_counted_as_revoked_gaps(
    work: dict[str, str],
) -> None:
    """#28 point 4: a forged ShmLeaseRevoked naming the producer's lease makes the consumer
    unmap until the driver's next announce of the epoch contradicts it; the producer goes on
    (it confirms the notice with the driver). The frames committed meanwhile never reach the
    consumer: each one is a ``revoked`` drop and counts in ``drops_gap`` and in the QoS
    message's ``drops_gap``, not as ``before_join``. Checked against the seqs that did not
    arrive (the producer at 100 Hz, the real daemon and media driver, the forger a third
    Aeron client publishing the generated codec's bytes on the control stream)."""
    daemon = DriverProcess(work["config"], work["base"], os.path.join(work["root"], "d.log"))
    daemon.start().wait_ready(WAIT)
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=work["aeron"]),
        channels=Endpoints(control_channel=CONTROL, control_stream_id=CONTROL_STREAM),
        shm_base_dir=work["base"],
        announce_period_ns=200_000_000,
        qos_period_ns=100_000_000,
    )
    ctx = AeronContext(settings.transport)
    forger: ControlClient | None = None
    try:
        ctx.start()
        producer = Producer(ctx, STREAM, settings, driver=True)
        producer.wait_until_attached(WAIT)
        consumer = Consumer(ctx, STREAM, settings, driver=True)
        forger = ControlClient(work["aeron"], channel=CONTROL, stream_id=CONTROL_STREAM)
        qos_gaps: list[tuple[int, int]] = []  # (last_seq_seen, drops_gap) of our consumer

        def on_qos(buffer: object, header: object) -> None:
            dec = decode_any(buffer)
            if isinstance(dec, wire.QosConsumerDecoder) and (
                dec.consumer_id == consumer.consumer_id
            ):
                qos_gaps.append((dec.last_seq_seen, dec.drops_gap))

        ch = settings.channels
        qos_sub = ctx.add_subscription(ch.qos_channel, ch.qos_stream_id, on_qos)
        got: list[int] = []

        def on_frame(frame: Frame) -> None:
            got.append(frame.seq)

        frame = np.arange(64, dtype=np.uint8)
        sent: list[int] = []

        def run(seconds: float, *, produce: bool = True) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if produce:
                    seq = producer.offer(frame)
                    assert seq is not None, producer.stats.drops.snapshot()
                    sent.append(seq)
                producer.do_work()
                consumer.poll(on_frame)
                qos_sub.poll()
                time.sleep(0.01)  # about 100 Hz

        deadline = time.monotonic() + WAIT
        # attached, mapped, and an announce taken since: a revoke is plausible only within a
        # freshness window of the driver's newest announce (ConsumerCore.on_lease_event)
        while not got or consumer.core.newest_announce_ns == 0:
            assert time.monotonic() < deadline, consumer.stats.control.snapshot()
            run(0.05)
        lease = producer.lease_id
        assert lease is not None
        before_join = consumer.stats.drops["before_join"]
        assert consumer.drops_gap == 0

        forger.send(_forged_revoke(lease, producer.producer_id))
        deadline = time.monotonic() + WAIT
        while consumer.stats.control["producer_revoke_contradicted"] == 0:
            assert time.monotonic() < deadline, consumer.stats.control.snapshot()
            run(0.05)
        run(0.3)
        last = sent[-1]
        deadline = time.monotonic() + WAIT
        while (not got or got[-1] != last) or not qos_gaps or qos_gaps[-1][0] < last:
            assert time.monotonic() < deadline, (got[-5:], last, qos_gaps[-3:])
            run(0.05, produce=False)  # drain: the last frame and a QoS report after it

        assert consumer.stats.control["producer_revoked"] == 1
        assert producer.lease_counters.get("notice_not_confirmed") == 1  # the producer went on
        assert sent == list(range(sent[0], last + 1)), "a gap in the producer's seqs"
        received = set(got)
        missing = [s for s in range(got[0], last + 1) if s not in received]
        assert missing, "the forged revoke cost no frame: nothing to count"
        drops = consumer.stats.drops.snapshot()
        assert drops.get("revoked", 0) == len(missing), (drops, len(missing))
        assert consumer.drops_gap == len(missing)
        assert consumer.stats.drops["before_join"] == before_join  # not counted as a join
        assert consumer.drops_late == 0
        assert qos_gaps[-1] == (last, len(missing))  # what the QoS message reports
    finally:
        if forger is not None:
            forger.close()
        ctx.close()  # before the daemon takes its media driver away
        daemon.stop()
