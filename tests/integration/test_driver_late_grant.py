"""A driver that stalls past the client's attach timeout (Driver Model §4.2, §4.8).

The client gives up on its attach request after ``attach_timeout_ns`` and sends a new one.
When the stalled driver resumes it answers both, in order: it grants the first (a lease for
our client id) and refuses the second, because one client id holds one lease (§4.8). A
client that ignored the late grant would be refused until that unused lease expired — here
30 s. The real daemon is stopped with SIGSTOP (a stall no other way produces) while a
driver-mode producer attaches; after SIGCONT the producer must hold the first request's lease,
with no refusal seen. No timing thresholds: every wait is on a condition.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from driver_fixtures import DriverProcess, driver_toml, read_status

from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess

pytestmark = pytest.mark.slow
STREAM = 10000
CONTROL = 1830


@pytest.fixture
def daemon(media_driver: MediaDriverProcess) -> Iterator[tuple[DriverProcess, str]]:
    work = tempfile.mkdtemp(
        prefix="tp-late-grant-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    base = os.path.join(work, "shm")
    # 30 s leases: an unused lease would keep the producer out far longer than the test waits
    policies = {"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 30}
    Path(work, "driver.toml").write_text(
        driver_toml(base, media_driver.dir, control_stream_id=CONTROL, policies=policies)
    )
    driver = DriverProcess(
        os.path.join(work, "driver.toml"), base, os.path.join(work, "driver.log")
    )
    try:
        driver.start().wait_ready()
        yield driver, base
    finally:
        driver.signal(signal.SIGCONT)
        driver.stop()
        shutil.rmtree(work, ignore_errors=True)


def _pump(producer: Producer, until: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"{what}: {producer.lease_counters}"
        producer.do_work()
        time.sleep(0.002)


def test_s4_8_a_grant_answered_after_the_attach_timed_out_is_taken(
    media_driver: MediaDriverProcess, daemon: tuple[DriverProcess, str]
) -> None:
    driver, base = daemon
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=base,
        channels=Endpoints(control_stream_id=CONTROL),
        announce_period_ns=200_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        driver.signal(signal.SIGSTOP)
        producer = Producer(ctx, STREAM, settings, driver=True)
        try:
            # the first request goes unanswered past the client's attach timeout (2 s)
            _pump(
                producer,
                lambda: producer.lease_counters.get("attach_timeout", 0) >= 1,
                "the first attach request timed out",
                30,
            )
            driver.signal(signal.SIGCONT)
            _pump(producer, lambda: producer.attached, "attached after the driver resumed", 20)
            counters = producer.lease_counters
            assert counters.get("late_grant_taken") == 1, counters
            assert not [k for k in counters if k.startswith("attach_code_")], counters
            _pump(
                producer,
                lambda: any(
                    lease["lease_id"] == producer.lease_id
                    for lease in (read_status(base) or {}).get("leases", [])
                ),
                "the driver's status lists the producer's lease",
                10,
            )
            leases = [
                lease
                for lease in (read_status(base) or {}).get("leases", [])
                if lease["stream_id"] == STREAM
            ]
            assert [lease["lease_id"] for lease in leases] == [producer.lease_id]
        finally:
            producer.close()
