"""#30 soak defect (a): a producer must not stay on an epoch the driver has moved past.

Found by `tensorpool soak` (seed 3, `kill9-driver`/`sigterm-driver`): after the SHM driver
was killed and restarted on a loaded host, producer 108 went on writing epoch 6 while the
driver announced epoch 7 (its lease had ended at the driver: `lease_expired` 1, then 45
`keepalive_unknown_lease`), and consumer 108 delivered nothing for the rest of the run. The
producer never read the driver's `ShmLeaseRevoked`, and nothing else told it: the driver
ignores keepalives for leases it does not know, and any announce of the stream counted as
the driver's liveness, whatever its epoch.

The default deployment runs here: the `tensorpool driver` daemon hosting its embedded media
driver, as a real subprocess; a producer and a consumer in driver mode in this process. The
driver ends the producer's lease for real (a `ShmDetachRequest` for it, sent by a third Aeron
client), and the one fault that cannot be produced on demand, the revoke notice lost on the
way, is injected by dropping it in the producer's lease machine. The driver then announces
the stream at a new epoch; the producer must ask the driver and move to a live lease, and
the consumer must receive its frames again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
from driver_fixtures import ControlClient, DriverProcess, embedded_driver_work

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.specs.generated import driver as dp
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

pytestmark = pytest.mark.slow

CONTROL = "aeron:ipc?term-length=4m"
CONTROL_STREAM = 1000
STREAM = 10000
WAIT = 60.0


@pytest.fixture
def work() -> Iterator[dict[str, str]]:
    with embedded_driver_work("tp-superseded-", CONTROL) as paths:
        yield paths


def test_30_producer_whose_lease_ended_unseen_follows_the_newer_epoch(
    work: dict[str, str],
) -> None:
    """#30 (a): the driver ended the producer's lease and its revoke never arrived; the
    driver's announce of a newer epoch makes the producer confirm its lease, get a new one,
    and write where the consumer reads (frames at an epoch above the lost lease's)."""
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
        got: list[int] = []

        def on_frame(frame: Frame) -> None:
            got.append(frame.epoch)

        frame = np.arange(64, dtype=np.uint8)

        def run_until(cond: object, what: str) -> None:
            deadline = time.monotonic() + WAIT
            while not cond():  # type: ignore[operator]
                assert time.monotonic() < deadline, what
                producer.offer(frame)
                producer.do_work()
                consumer.poll(on_frame)
                time.sleep(0.002)

        run_until(lambda: bool(got), "the consumer never received a frame")
        old_epoch, lease = producer.epoch, producer.lease_id
        assert lease is not None
        # the fault: the producer's lease machine never sees the driver's revoke
        machine = producer._driver.machine  # type: ignore[union-attr]
        machine.on_lease_revoked = lambda r, now: []  # type: ignore[method-assign]

        forger = ControlClient(work["aeron"], channel=CONTROL, stream_id=CONTROL_STREAM)
        forger.wait_connected(WAIT)
        held = {"lease_id": lease, "stream_id": STREAM}
        answer = forger.detach(held, producer.producer_id, int(dp.Role.PRODUCER), timeout=WAIT)
        assert answer["code"] == int(dp.ResponseCode.OK), answer

        got.clear()
        run_until(
            lambda: any(e > old_epoch for e in got),
            f"no frame after the lease of epoch {old_epoch} ended unseen "
            f"(producer still at epoch {producer.epoch})",
        )
        assert producer.epoch > old_epoch and producer.lease_id != lease
        assert producer.lease_counters.get("notice_confirmed:superseded_epoch") == 1
    finally:
        if forger is not None:
            forger.close()
        ctx.close()  # before the daemon takes its media driver away
        daemon.stop()
