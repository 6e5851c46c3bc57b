"""#26.1, #26.2, #26.4: daemons on an *external* media driver survive its ``kill -9`` and a new
one on the same directory, without being restarted themselves.

The operator's setup from docs/operator.md: ``tensorpool mediadriver --dir D`` first, then the
SHM driver with ``embedded_media_driver = false`` and clients joining D. Before #26 the SHM
driver never called ``AeronContext.maintain()``: after the restart its control subscription
and publications stayed bound to the dead media driver, and driver-mode clients got no lease
(and no frames) ever again while ``driver status`` said RUNNING.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import CONTROL_CHANNEL, DriverProcess, cli, driver_toml
from mdrestart import Cli, frames, start_media_driver, wait_for

pytestmark = pytest.mark.slow
STREAM = 10003
_controls = iter(range(2600, 2700))


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-mdr-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _client_args(aeron_dir: str, base: str, control: int) -> list[str]:
    return [
        "--driver",
        "--aeron-dir",
        aeron_dir,
        "--shm-base-dir",
        base,
        "--control-channel",
        CONTROL_CHANNEL,
        "--control-stream-id",
        str(control),
        "--stream-id",
        str(STREAM),
        "--json",
        "--report-interval",
        "0.2",
    ]


def test_26_2_shm_driver_survives_external_media_driver_kill9_and_restart(work: str) -> None:
    """kill -9 of the external media driver, a new one 2 s later on the same directory: frames
    flow again from the same producer to the same consumer through the same SHM driver, and
    while the media driver is gone ``driver status`` says so and exits non-zero (#26.3)."""
    aeron_dir = os.path.join(work, "aeron")
    base = os.path.join(work, "shm")
    control = next(_controls)
    Path(work, "driver.toml").write_text(driver_toml(base, aeron_dir, control_stream_id=control))
    started: list[Cli] = []
    md = start_media_driver(work, aeron_dir, "md1")
    started.append(md)
    daemon = DriverProcess(
        os.path.join(work, "driver.toml"), base, os.path.join(work, "driver.log")
    )
    try:
        daemon.start().wait_ready()
        args = _client_args(aeron_dir, base, control)
        producer = Cli(work, "produce", "produce", *args, "--rate", "100", "--shape", "64")
        consumer = Cli(work, "consume", "consume", *args)
        started += [producer, consumer]
        wait_for(lambda: frames(consumer) >= 20, 60, consumer.text)

        md.kill9()
        status = os.path.join(base, "default", "driver-status.json")
        # #26.3: the daemon is alive but serving nobody, and says so
        lost: dict[str, object] = {}

        def says_lost() -> bool:
            r = cli("driver", "status", "--status-file", status, "--json")
            if r.returncode != 0 and '"media_driver_lost"' in r.stdout:
                lost["out"] = r.stdout
                return True
            return False

        wait_for(says_lost, 30, lambda: cli("driver", "status", "--status-file", status).stdout)
        time.sleep(2)
        before = frames(consumer)
        t0 = time.monotonic()
        started.append(start_media_driver(work, aeron_dir, "md2"))
        wait_for(
            lambda: frames(consumer) >= before + 20,
            90,
            lambda: f"{consumer.text()}\n{producer.text()}\n{daemon.log_text()[-3000:]}",
        )
        print(f"recovery: driver-mode consumer frames back {time.monotonic() - t0:.2f} s")
        assert daemon.proc is not None and daemon.proc.poll() is None  # never restarted
        r = cli("driver", "status", "--status-file", status)
        assert r.returncode == 0, r.stdout
    finally:
        for proc in reversed(started):
            proc.stop()
        daemon.stop()


def test_26_4_mediadriver_started_right_after_kill9_waits_and_starts(work: str) -> None:
    """A ``tensorpool mediadriver`` started at once after ``kill -9`` of the previous one on the
    same directory waits for the old heartbeat to go stale (saying so in one line) and serves,
    instead of exiting with "a media driver is already active"."""
    aeron_dir = os.path.join(work, "aeron")
    first = start_media_driver(work, aeron_dir, "md1")
    first.kill9()
    second = start_media_driver(work, aeron_dir, "md2")
    try:
        with open(second.err) as f:
            waited = [line for line in f if "waiting" in line]
        assert len(waited) <= 1, waited  # one line, when there was something to wait for
        assert second.proc.poll() is None
    finally:
        second.stop()
