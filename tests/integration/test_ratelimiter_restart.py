"""#30 soak defect (c): a rate limiter started after its predecessor was killed delivers again.

Found by `tensorpool soak` (`kill9-ratelimiter`, `sigterm-ratelimiter`): after the limiter
was stopped and a new one started, consumer 115 sometimes got nothing for 30 s. Here the
parts are real processes (the `tensorpool driver` daemon, `tensorpool produce --driver` at
200 Hz, `tensorpool ratelimiter`), the consumer of the destination a driver-mode Consumer in
this process; the limiter is killed (-9 or SIGTERM) and restarted several times, and after
each start the consumer must receive frames at the new limiter's destination epoch. Both
deployments: the daemon hosting its embedded media driver (the default) and an external
`tensorpool mediadriver`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from driver_fixtures import DriverProcess, driver_toml
from jsonlines_proc import JsonLinesProcess

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.slow

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
SOURCE, DEST = 10001, 10002
DEST_DESCRIPTORS = 2100
CONTROL = "aeron:ipc?term-length=1m"
WAIT = 120.0  # a restarted Python process on a loaded 2-core host
# 2 s leases: a killed limiter's destination lease ends by expiry, within the test's waits
POLICIES = {"lease_keepalive_interval_ms": 200, "lease_expiry_grace_intervals": 10}


@pytest.fixture(params=["embedded", "external"])
def deployment(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="tp-rl-restart-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    md = MediaDriverProcess().start() if request.param == "external" else None
    aeron = md.dir if md is not None else os.path.join(work, "aeron")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(
        driver_toml(base, aeron, embedded=md is None, streams=[SOURCE, DEST], policies=POLICIES)
    )
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start().wait_ready()
    producer = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "produce", "--driver", "--stream-id", str(SOURCE),
         "--shape", "64", "--dtype", "uint8", "--rate", "200", "--pattern", "stamp", "--quiet",
         "--aeron-dir", aeron, "--shm-base-dir", base],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "producer.log"), "wb"),  # noqa: SIM115
    )  # fmt: skip
    ctx = AeronContext(TransportConfig(aeron_dir=aeron)).start()
    try:
        yield {"work": work, "base": base, "aeron": aeron, "driver_config": cfg, "ctx": ctx}
    finally:
        ctx.close()
        stop_process(producer, 20)
        daemon.stop()
        if md is not None:
            md.stop()
        shutil.rmtree(work, ignore_errors=True)


def _rl_config(dep: dict[str, Any]) -> str:
    path = os.path.join(dep["work"], "rl.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-restart"
descriptor_channel = "aeron:ipc?term-length=1m"
descriptor_stream_id = {DEST_DESCRIPTORS}
max_rate_hz = 20

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {DEST}
profile = "small"

[driver]
aeron_dir = "{dep["aeron"]}"
control_channel = "{CONTROL}"
config = "{dep["driver_config"]}"

[shm]
base_dir = "{dep["base"]}"
"""
    )
    return path


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_30_restarted_rate_limiter_delivers_at_its_new_epoch(
    deployment: dict[str, Any], sig: int
) -> None:
    """#30 (c): twice, a limiter starts, the destination's consumer receives frames at
    that limiter's destination epoch, and the limiter is killed; the next one must be heard
    from the same way (no frame of an old epoch counts)."""
    dep = deployment
    settings = ClientSettings(
        transport=dep["ctx"].config,
        channels=Endpoints(control_channel=CONTROL, descriptor_stream_id=DEST_DESCRIPTORS),
        shm_base_dir=dep["base"],
    )
    consumer = Consumer(dep["ctx"], DEST, settings, driver=True)
    epochs: list[int] = []
    got: list[int] = []

    def on_frame(frame: Frame) -> None:
        got.append(frame.epoch)

    config = _rl_config(dep)
    try:
        for _ in range(2):
            rl = JsonLinesProcess(
                [sys.executable, "-m", "tensorpool", "ratelimiter", "--config", config,
                 "--json", "--report-interval", "0.5"],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                epoch = rl.wait_event("started", WAIT)["mappings"][0]["dest_epoch"]
                epochs.append(epoch)
                deadline = time.monotonic() + WAIT
                while epoch not in got:
                    assert time.monotonic() < deadline, (
                        f"no frame at the limiter's epoch {epoch} (epochs so far {epochs}, "
                        f"consumer at {consumer.epoch}: {consumer.stats})"
                    )
                    consumer.poll(on_frame)
                    time.sleep(0.005)
            finally:
                rl.proc.send_signal(sig)
                rl.proc.wait(60)
            got.clear()
    finally:
        consumer.close()
    assert epochs == sorted(set(epochs)), epochs  # each start a new, higher epoch
