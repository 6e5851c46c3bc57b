"""Real clients through real driver failures (Driver Model §4.7a, §4.9, §4.13, §7, §10).

A producer process (`roles.py producer --driver`) and an in-process consumer attach through
a `tensorpool driver` daemon; the test kills the producer, restarts the driver, and kills the
driver, and checks that the same consumer keeps getting frames from ever higher epochs.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import DriverProcess, driver_toml

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess

pytestmark = pytest.mark.slow
STREAM = 10000
_streams = iter(range(1700, 1800))


@pytest.fixture
def setup(media_driver: MediaDriverProcess) -> Iterator[tuple[str, str, int]]:
    work = tempfile.mkdtemp(
        prefix="tp-recov-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    control = next(_streams)
    base = os.path.join(work, "shm")
    Path(work, "driver.toml").write_text(
        driver_toml(base, media_driver.dir, control_stream_id=control)
    )
    yield work, base, control
    shutil.rmtree(work, ignore_errors=True)


def _daemon(work: str, name: str) -> DriverProcess:
    return (
        DriverProcess(
            os.path.join(work, "driver.toml"),
            os.path.join(work, "shm"),
            os.path.join(work, f"{name}.log"),
        )
        .start()
        .wait_ready()
    )


def _frames_until(consumer: Consumer, got: list[tuple[int, int]], pred, timeout: float) -> None:
    def handler(frame: Frame) -> None:
        got.append((frame.epoch, frame.seq))

    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        if not consumer.poll(handler):
            time.sleep(0.002)
    assert pred(), (got[-5:], consumer.stats.control.snapshot(), consumer.stats.drops.snapshot())


def _producer(roles, media_driver, base: str, control: int):
    return roles(
        "producer",
        "--driver",
        "--control-stream-id",
        str(control),
        "--stream-id",
        str(STREAM),
        "--rate",
        "200",
        "--duration",
        "120",
        "--announce-period",
        "0.2",
        "--shm-base-dir",
        base,
    )  # the driver's base dir: its paths must be allowed


def _consumer(ctx: AeronContext, media_driver, base: str, control: int) -> Consumer:
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=base,
        channels=Endpoints(control_stream_id=control),
        announce_period_ns=200_000_000,
    )
    return Consumer(ctx, STREAM, settings, driver=True)


def test_s7_producer_kill9_new_epoch_and_new_producer_reaches_same_consumer(
    setup, media_driver, roles
) -> None:
    work, base, control = setup
    daemon = _daemon(work, "d")
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            consumer = _consumer(ctx, media_driver, base, control)
            p1 = _producer(roles, media_driver, base, control)
            e1 = p1.wait_event("ready")["epoch"]
            got: list[tuple[int, int]] = []
            _frames_until(consumer, got, lambda: sum(e == e1 for e, _ in got) >= 20, 30)
            p1.proc.send_signal(signal.SIGKILL)  # no detach: the lease must expire (§7)
            p1.proc.wait()
            p2 = _producer(roles, media_driver, base, control)
            e2 = p2.wait_event("ready", timeout=30)["epoch"]
            assert e2 > e1
            _frames_until(consumer, got, lambda: sum(e == e2 for e, _ in got) >= 20, 30)
            first_new = next(i for i, (e, _) in enumerate(got) if e == e2)
            assert all(e == e2 for e, _ in got[first_new:])  # nothing old after the remap
            assert consumer.stats.remaps >= 2 and consumer.epoch == e2
            consumer.close()
    finally:
        daemon.stop()


def test_s10_driver_restart_and_crash_clients_reattach_with_higher_epochs(
    setup, media_driver, roles
) -> None:
    work, base, control = setup
    daemon = _daemon(work, "first")
    try:
        with AeronContext(TransportConfig(aeron_dir=media_driver.dir)) as ctx:
            ctx.start()
            consumer = _consumer(ctx, media_driver, base, control)
            _producer(roles, media_driver, base, control).wait_event("ready")
            got: list[tuple[int, int]] = []
            _frames_until(consumer, got, lambda: len(got) >= 20, 30)
            e1 = max(e for e, _ in got)

            daemon.signal(signal.SIGTERM)  # §4.13: ShmDriverShutdown, then exit
            assert daemon.wait() == 0
            daemon = _daemon(work, "second")
            _frames_until(consumer, got, lambda: max(e for e, _ in got) > e1, 40)
            assert consumer.stats.control["lease_lost"] >= 1
            e2 = max(e for e, _ in got)

            daemon.signal(signal.SIGKILL)  # §10: no notice at all; clients must fail closed
            daemon.wait()
            deadline = time.monotonic() + 20
            while consumer.is_mapped and time.monotonic() < deadline:
                consumer.poll(lambda f: None)
                time.sleep(0.01)
            assert not consumer.is_mapped  # stale announces: nothing read from a dead driver
            daemon = _daemon(work, "third")
            _frames_until(consumer, got, lambda: max(e for e, _ in got) > e2, 40)
            consumer.close()
    finally:
        daemon.stop()
