"""Per-consumer descriptor streams (issue #29.1; Wire Spec §10.1.3, §11; Driver Model §11).

Real processes over a real media driver: `tensorpool produce` (and `tensorpool driver`) as
subprocesses, consumers as real clients in the test. A RATE_LIMITED consumer of a producer that
offers per-consumer streams gets its own descriptor stream (from the producer's range standalone,
from the driver's ``descriptor_stream_id_range`` in driver mode) carrying only the frames its
``max_rate_hz`` admits; declines keep it on the shared stream; a stream nobody publishes on
sends it back to the shared one; a stale consumer's id is released and handed out again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from driver_fixtures import DriverProcess, driver_toml

from tensorpool.client.conductor import ContextConductor
from tensorpool.client.consumer import MODE_RATE_LIMITED, Consumer, Frame
from tensorpool.client.per_consumer import STALE_PERIODS
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings, Endpoints
from tensorpool.config_util import IdRange
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.slow
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
_controls = iter(range(2900, 3000))  # a control stream per test: no cross-talk
RANGE = "31000-31001"
DRIVER_STREAM = 10000  # a stream the driver's config provisions
DRIVER_ANNOUNCE = 200_000_000  # driver_toml's announce period
SHARED_ID = Endpoints().descriptor_stream_id


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-percons-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _settings(md: MediaDriverProcess, base: str, control: int, **kw: int) -> ClientSettings:
    return ClientSettings(
        transport=TransportConfig(aeron_dir=md.dir),
        shm_base_dir=base,
        channels=Endpoints(control_stream_id=control),
        **kw,  # type: ignore[arg-type]
    )


def _produce(
    md: MediaDriverProcess, base: str, control: int, *args: str, stream: int = 7
) -> subprocess.Popen:
    """`tensorpool produce`: 1 kHz of 64-byte frames for a minute."""
    cmd = [sys.executable, "-m", "tensorpool", "produce", "--stream-id", str(stream)]
    cmd += ["--shape", "64"]
    cmd += ["--dtype", "uint8", "--rate", "1000", "--duration", "60", "--quiet"]
    cmd += ["--aeron-dir", md.dir, "--shm-base-dir", base, "--control-stream-id", str(control)]
    cmd += [*args]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _poll_until(
    consumers: list[Consumer], pred: Callable[[], bool], timeout: float, seqs: list[int]
) -> None:
    def handler(frame: Frame) -> None:
        seqs.append(frame.seq)

    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        if not sum(c.poll(handler) for c in consumers):
            time.sleep(0.001)
    assert pred(), [(c.descriptor_stream, c.stats.control.snapshot()) for c in consumers]


def _own_stream_at_rate(consumer: Consumer, seqs: list[int], window_s: float) -> None:
    """On its own stream the consumer receives about max_rate_hz descriptors a second, not
    the producer's 1000: at most one per grid slot, plus the slots cut at the window's ends."""
    d0, f0, t0 = consumer.stats.descriptors, consumer.stats.frames, time.monotonic()
    _poll_until([consumer], lambda: time.monotonic() - t0 >= window_s, window_s + 30, seqs)
    elapsed = time.monotonic() - t0
    received = consumer.stats.descriptors - d0
    assert consumer.stats.frames - f0 >= 3, consumer.stats  # frames do arrive
    assert received <= 10 * elapsed + 3, (received, elapsed)  # 10 Hz, not 1 kHz
    assert consumer.drops_gap == 0  # the frames the producer skipped are not losses
    assert consumer.stats.drops["rate_limited"] > 0  # they are what the rate left out


def test_s10_1_3_standalone_rate_limited_consumer_gets_own_stream_from_producer_range(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """§10.1.3, §11: a standalone producer offering per-consumer streams answers a RATE_LIMITED
    hello with its own range's stream id; the consumer follows it and receives ~max_rate_hz
    descriptors a second, on the RateGate grid, while the shared stream carries 1 kHz."""
    control = next(_controls)
    proc = _produce(
        media_driver, work, control, "--per-consumer-streams", "--per-consumer-stream-ids", RANGE
    )
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            settings = _settings(media_driver, work, control)
            limited = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10)
            shared = Consumer(ctx, 7, settings)
            try:
                seqs: list[int] = []
                _poll_until(
                    [limited, shared],
                    lambda: (
                        limited.descriptor_stream != shared.descriptor_stream
                        and shared.stats.frames > 50
                    ),
                    60,
                    seqs,
                )
                channel, sid = limited.descriptor_stream
                assert (
                    sid in IdRange(31000, 31001) and channel == settings.channels.descriptor_channel
                )
                assert shared.descriptor_stream == (channel, settings.channels.descriptor_stream_id)
                _own_stream_at_rate(limited, seqs, 2.0)
            finally:
                limited.close()
                shared.close()
    finally:
        stop_process(proc)


def test_s10_1_3_standalone_declines_when_range_unset(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """§10.1.3: a producer offering per-consumer streams without a range declines (empty
    channel, id 0): the consumer stays on the shared stream and drops locally (§11)."""
    control = next(_controls)
    proc = _produce(media_driver, work, control, "--per-consumer-streams")
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            settings = _settings(media_driver, work, control)
            consumer = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10)
            try:
                seqs: list[int] = []
                _poll_until(
                    [consumer],
                    lambda: consumer.config_declined is True and consumer.stats.frames >= 3,
                    60,
                    seqs,
                )
                shared = (
                    settings.channels.descriptor_channel,
                    settings.channels.descriptor_stream_id,
                )
                assert consumer.descriptor_stream == shared
            finally:
                consumer.close()
    finally:
        stop_process(proc)


def test_s10_1_3_exhausted_range_declines_and_stale_consumer_releases_its_id(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """§10.1.3 / Driver Model §11: with one id left, a second consumer is declined; once the
    first goes stale (no hello for 5 QoS periods) its stream is closed and its id handed out
    again."""
    control = next(_controls)
    settings = _settings(media_driver, work, control, qos_period_ns=100_000_000)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(
            ctx,
            StreamConfig.for_frame_bytes(7, 64, header_nslots=256),
            settings,
            per_consumer=True,
            per_consumer_ids=IdRange(31000, 31000),
        )
        first = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=50)
        second = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=50)
        seqs: list[int] = []
        try:

            def pump(pred: Callable[[], bool], clients: list[Consumer]) -> None:
                deadline = time.monotonic() + 30
                while not pred() and time.monotonic() < deadline:
                    producer.offer(np.zeros(64, np.uint8))
                    producer.do_work()
                    for c in clients:
                        c.poll(lambda f: seqs.append(f.seq))
                    time.sleep(0.002)
                assert pred(), [c.descriptor_stream for c in clients]

            pump(
                lambda: first.descriptor_stream[1] == 31000 and second.config_declined is True,
                [first, second],
            )
            assert first.descriptor_stream[1] == 31000
            assert second.descriptor_stream[1] == settings.channels.descriptor_stream_id
            f0 = first.stats.frames
            pump(lambda: first.stats.frames > f0 + 2, [first, second])
            assert producer.stats.consumer_descriptors > 0
            first.close()  # no more hellos: stale after 5 x 100 ms
            streams = producer._core.per_consumer
            assert streams is not None
            pump(lambda: 31000 not in [s.stream_id for s in streams.streams.values()], [second])
            assert streams.counters["released"] >= 1
            pump(lambda: second.descriptor_stream[1] == 31000, [second])  # the id again
        finally:
            second.close()
            first.close()
            producer.close()


def test_s10_1_3_channel_aeron_refuses_is_declined_and_the_producer_keeps_running(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """Bad input (#29.1, §10.1.3): a hello naming an IPC channel Aeron refuses (term length 3)
    does not stop the producer: the publication fails, is counted, the id is released and the
    answer is a decline."""
    control = next(_controls)
    settings = _settings(media_driver, work, control)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(
            ctx,
            StreamConfig.for_frame_bytes(7, 64),
            settings,
            per_consumer=True,
            per_consumer_ids=IdRange(31000, 31000),
        )
        listener = Consumer(ctx, 7, settings, consumer_id=77)  # receives configs for 77
        hello_pub = ctx.add_publication(settings.channels.control_channel, control)
        buf = bytearray(512)
        n = wire.ConsumerHelloEncoder.encode(
            buf,
            0,
            stream_id=7,
            consumer_id=77,
            supports_shm=1,
            supports_progress=0,
            mode=int(wire.Mode.STREAM),
            max_rate_hz=0,
            expected_layout_version=0,
            descriptor_stream_id=31000,
            control_stream_id=0,
            descriptor_channel="aeron:ipc?term-length=3",
            control_channel="",
        )
        streams = producer._core.per_consumer
        assert streams is not None
        try:
            deadline = time.monotonic() + 30
            while streams.counters.get("open_failed", 0) == 0 and time.monotonic() < deadline:
                hello_pub.offer(buf, 0, n)
                producer.do_work()  # must not raise
                listener.poll(lambda f: None)
                time.sleep(0.01)
            assert streams.counters["open_failed"] >= 1
            for _ in range(50):  # the answers to the bad requests reach the listener
                hello_pub.offer(buf, 0, n)
                producer.do_work()
                listener.poll(lambda f: None)
                time.sleep(0.01)
            assert streams.streams == {} and producer.stats.consumer_descriptors == 0
            assert listener.config_declined is True
            assert listener.descriptor_stream[1] == SHARED_ID
            # the answer was a decline, not the refused channel (which the consumer would try)
            assert listener.stats.control["descriptor_stream_invalid"] == 0
        finally:
            ctx.release(hello_pub)
            listener.close()
            producer.close()


def test_s10_1_3_config_naming_the_shared_stream_is_a_decline(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """Driver Model §11 words an unset-range decline as "return the shared channel and stream
    IDs" (another driver may answer so): a ``ConsumerConfig`` naming the consumer's own shared
    stream leaves it there with its local rate grid on (§11), not "assigned" to it."""
    control = next(_controls)
    settings = _settings(media_driver, work, control)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(ctx, StreamConfig.for_frame_bytes(7, 64), settings)
        consumer = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10)
        pub = ctx.add_publication(settings.channels.control_channel, control)
        buf = bytearray(512)
        n = wire.ConsumerConfigEncoder.encode(
            buf,
            0,
            stream_id=7,
            consumer_id=consumer.consumer_id,
            use_shm=1,
            mode=int(wire.Mode.RATE_LIMITED),
            descriptor_stream_id=SHARED_ID,
            control_stream_id=0,
            payload_fallback_uri="",
            descriptor_channel=settings.channels.descriptor_channel,
            control_channel="",
        )
        try:
            deadline = time.monotonic() + 30
            while consumer.stats.frames < 3 and time.monotonic() < deadline:
                pub.offer(buf, 0, n)
                producer.offer(np.zeros(64, np.uint8))
                producer.do_work()
                consumer.poll(lambda f: None)
                time.sleep(0.002)
            for _ in range(50):  # answers keep coming: still on the shared stream, grid on
                pub.offer(buf, 0, n)
                producer.do_work()
                consumer.poll(lambda f: None)
                time.sleep(0.002)
            assert consumer.stats.frames >= 3
            assert consumer.descriptor_stream[1] == SHARED_ID
            assert consumer.config_declined is True and not consumer.core.per_consumer
            assert consumer.stats.control["descriptor_stream_assigned"] == 0
        finally:
            ctx.release(pub)
            consumer.close()
            producer.close()


# --- driver mode --------------------------------------------------------------------------------


def _driver(media_driver: MediaDriverProcess, work: str, control: int, rng: str) -> DriverProcess:
    base = os.path.join(work, "shm")
    # a long lease grace: a loaded host must not revoke the producer under the test
    policies = {"lease_expiry_grace_intervals": 50}
    text = driver_toml(base, media_driver.dir, control_stream_id=control, policies=policies)
    if rng:
        text = text.replace(
            'stream_id_range = "20000-20099"',
            f'stream_id_range = "20000-20099"\ndescriptor_stream_id_range = "{rng}"',
        )
    cfg = Path(work, "driver.toml")
    cfg.write_text(text)
    return DriverProcess(str(cfg), base, os.path.join(work, "driver.log")).start().wait_ready()


def test_driver_s11_assigns_from_descriptor_stream_id_range(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """Driver Model §11: the driver answers a lease holder's RATE_LIMITED hello with an id of
    its descriptor_stream_id_range; the producer (offering per-consumer streams) follows the
    driver's ConsumerConfig and publishes the admitted frames there."""
    control = next(_controls)
    daemon = _driver(media_driver, work, control, RANGE)
    base = os.path.join(work, "shm")
    proc = _produce(
        media_driver, base, control, "--driver", "--per-consumer-streams", stream=DRIVER_STREAM
    )
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            settings = _settings(media_driver, base, control, announce_period_ns=DRIVER_ANNOUNCE)
            consumer = Consumer(
                ctx, DRIVER_STREAM, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10, driver=True
            )
            try:
                seqs: list[int] = []
                _poll_until(
                    [consumer],
                    lambda: (
                        consumer.descriptor_stream[1] != SHARED_ID and consumer.stats.frames >= 3
                    ),
                    60,
                    seqs,
                )
                assert consumer.descriptor_stream[1] in IdRange(31000, 31001)
                _own_stream_at_rate(consumer, seqs, 2.0)
            finally:
                consumer.close()
    finally:
        stop_process(proc)
        daemon.stop()
    assert "consumer_config" in daemon.log_text()


def test_driver_s11_unset_range_declines_and_consumer_stays_on_its_shared_stream(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """Driver Model §11: no descriptor_stream_id_range -- the driver declines (Wire §10.1.3:
    empty channel, id 0) and the consumer stays on *its* shared stream, here not the driver's
    (2100, as a rate limiter's destination consumers read), dropping locally to its rate."""
    control = next(_controls)
    daemon = _driver(media_driver, work, control, "")
    base = os.path.join(work, "shm")
    proc = _produce(
        media_driver,
        base,
        control,
        "--driver",
        "--per-consumer-streams",
        "--descriptor-stream-id",
        "2100",
        stream=DRIVER_STREAM,
    )
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            settings = ClientSettings(
                transport=TransportConfig(aeron_dir=media_driver.dir),
                shm_base_dir=base,
                channels=Endpoints(control_stream_id=control, descriptor_stream_id=2100),
                announce_period_ns=DRIVER_ANNOUNCE,
            )
            consumer = Consumer(
                ctx, DRIVER_STREAM, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10, driver=True
            )
            try:
                seqs: list[int] = []
                _poll_until(
                    [consumer],
                    lambda: consumer.config_declined is True and consumer.stats.frames >= 3,
                    60,
                    seqs,
                )
                shared = (
                    settings.channels.descriptor_channel,
                    settings.channels.descriptor_stream_id,
                )
                assert consumer.descriptor_stream == shared
                # still rate-limited locally (§11): the shared stream's 1 kHz is cut to 10 Hz
                f0, t0 = consumer.stats.frames, time.monotonic()
                _poll_until([consumer], lambda: time.monotonic() - t0 >= 2.0, 30, seqs)
                elapsed = time.monotonic() - t0
                assert consumer.stats.frames - f0 <= 10 * elapsed + 3, elapsed
                assert consumer.config_declined is True and not consumer.core.per_consumer
            finally:
                consumer.close()
    finally:
        stop_process(proc)
        daemon.stop()


def test_s11_assigned_stream_without_publisher_falls_back_to_shared(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """§11: the driver assigns a stream, but the producer does not offer per-consumer streams
    (no publisher ever comes): the consumer keeps reading the shared stream meanwhile, gives
    the assignment up after a freshness window and does not take it again."""
    control = next(_controls)
    daemon = _driver(media_driver, work, control, RANGE)
    base = os.path.join(work, "shm")
    proc = _produce(media_driver, base, control, "--driver", stream=DRIVER_STREAM)  # not offering
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            settings = _settings(media_driver, base, control, announce_period_ns=DRIVER_ANNOUNCE)
            consumer = Consumer(
                ctx, DRIVER_STREAM, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10, driver=True
            )
            try:
                seqs: list[int] = []
                _poll_until(
                    [consumer],
                    lambda: consumer.stats.control["descriptor_stream_unconnected"] >= 1,
                    60,
                    seqs,
                )
                f0 = consumer.stats.frames
                _poll_until([consumer], lambda: consumer.stats.frames >= f0 + 3, 30, seqs)
                shared = (
                    settings.channels.descriptor_channel,
                    settings.channels.descriptor_stream_id,
                )
                assert consumer.descriptor_stream == shared
                assert consumer.stats.control["descriptor_stream_assigned"] == 0
                assert consumer.stats.control["descriptor_stream_unconnected"] == 1  # not again
            finally:
                consumer.close()
    finally:
        stop_process(proc)
        daemon.stop()


def _consume(md: MediaDriverProcess, base: str, control: int) -> subprocess.Popen:
    """`tensorpool consume` asking for 10 Hz of stream 7 (a per-consumer stream request)."""
    cmd = [sys.executable, "-m", "tensorpool", "consume", "--stream-id", "7"]
    cmd += ["--mode", "rate-limited", "--max-rate-hz", "10", "--duration", "120"]
    cmd += ["--report-interval", "60"]
    cmd += ["--aeron-dir", md.dir, "--shm-base-dir", base, "--control-stream-id", str(control)]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def test_s10_1_3_qos_keeps_a_live_consumers_stream_and_kill_9_releases_it(
    media_driver: MediaDriverProcess, work: str
) -> None:
    """§10.1.3: the producer judges a consumer stale on its hello/QoS, and hellos go out on
    start and changes only (§10.1.2). A real `tensorpool consume` process that says hello once
    keeps its per-consumer stream for longer than the stale window because it keeps sending
    QosConsumer; killed with SIGKILL it sends neither, so its stream is closed after the window
    and its id (the range's only one) goes to the next consumer."""
    control = next(_controls)
    settings = _settings(media_driver, work, control)  # 1 s QoS period: a 5 s stale window
    window_s = STALE_PERIODS * settings.qos_period_ns / 1e9
    proc = _consume(media_driver, work, control)
    try:
        with AeronContext(settings.transport) as ctx:
            ctx.start()
            hellos = ContextConductor.acquire(ctx)
            tap = hellos.tap(
                settings.channels.control_channel, control, (wire.ConsumerHelloDecoder,)
            )
            producer = Producer(
                ctx,
                StreamConfig.for_frame_bytes(7, 64, header_nslots=256),
                settings,
                per_consumer=True,
                per_consumer_ids=IdRange(31000, 31000),
            )
            streams = producer._core.per_consumer
            assert streams is not None
            seen: list[int] = []

            def pump(pred: Callable[[], bool], timeout: float, *clients: Consumer) -> None:
                deadline = time.monotonic() + timeout
                while not pred() and time.monotonic() < deadline:
                    producer.offer(np.zeros(64, np.uint8))
                    producer.do_work()
                    seen.extend(d.consumer_id for d, _raw, _j in tap.drain())
                    for c in clients:
                        c.poll(lambda f: None)
                    time.sleep(0.002)
                assert pred(), (streams.streams, streams.counters, proc.poll())

            def own() -> list[int]:
                return [s.stream_id for s in streams.streams.values()]

            try:
                pump(lambda: own() == [31000], 60)  # the process asked and got the range's id
                (cid,) = streams.streams
                # alive for three stale windows: QoS keeps the stream, no hello renews it
                t0 = time.monotonic()
                pump(lambda: time.monotonic() - t0 > 3 * window_s, 3 * window_s + 30)
                assert own() == [31000] and streams.counters["released"] == 0
                assert seen.count(cid) <= 2, seen  # start (and a remap at most), not per period
                proc.kill()  # SIGKILL: no detach, no last hello, no more QoS
                proc.wait(30)
                pump(lambda: own() == [], 3 * window_s + 60)
                assert streams.counters["released"] == 1
                other = Consumer(ctx, 7, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10)
                try:
                    pump(lambda: other.descriptor_stream[1] == 31000, 60, other)  # reused
                finally:
                    other.close()
            finally:
                producer.close()
                hellos.unregister(tap)
                hellos.release()
    finally:
        stop_process(proc)
