"""The rate limiter end to end with real processes (RateLimiter Spec §3, §4, §5, §6, §7).

`tensorpool driver` (daemon) + `tensorpool produce --driver` at 1 kHz + `tensorpool
ratelimiter` + consumers of the source and destination streams in this test process, all on
one standalone media driver. Assertions are about behaviour (which frames arrive, with which
seq, timestamp, payload, metadata and epoch), never about speed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from driver_fixtures import DriverProcess, driver_toml
from jsonlines_proc import JsonLinesProcess

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.process import stop_process

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
SOURCE = 10001  # statically provisioned in driver_toml (profile "small": 16 slots, 4 KiB)
DEST_DESCRIPTORS = 2100
CONTROL = "aeron:ipc?term-length=1m"
# The client lease machine does not move its expiry estimate forward on keepalives (reported
# to the lead), so leases get a long grace here; the tests are about the rate limiter.
POLICIES = {"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 60}


@pytest.fixture(scope="module")
def deployment(media_driver) -> Iterator[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="tp-rl-e2e-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(driver_toml(base, media_driver.dir, policies=POLICIES))
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start().wait_ready()
    producer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorpool",
            "produce",
            "--driver",
            "--stream-id",
            str(SOURCE),
            "--shape",
            "64,64",
            "--dtype",
            "uint8",
            "--rate",
            "1000",
            "--pattern",
            "stamp",
            "--meta",
            "gain=2.5",
            "--quiet",
            "--aeron-dir",
            media_driver.dir,
            "--shm-base-dir",
            base,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "producer.log"), "wb"),  # noqa: SIM115
    )
    ctx = AeronContext(TransportConfig(aeron_dir=media_driver.dir)).start()
    yield {"work": work, "base": base, "driver_config": cfg, "md": media_driver.dir, "ctx": ctx}
    ctx.close()
    producer.terminate()
    try:
        producer.wait(10)
    except subprocess.TimeoutExpired:
        producer.kill()
        producer.wait()
    daemon.stop()
    print(daemon.log_text())
    shutil.rmtree(work, ignore_errors=True)  # #13.6: nothing left behind


def rl_toml(dep: dict[str, Any], dest: int, *, rate: int = 20, instance: str = "rl-e2e") -> str:
    path = os.path.join(dep["work"], f"{instance}-{dest}.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "{instance}"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = {DEST_DESCRIPTORS}
max_rate_hz = {rate}

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {dest}
profile = "small"

[driver]
aeron_dir = "{dep["md"]}"
control_channel = "{CONTROL}"
config = "{dep["driver_config"]}"

[shm]
base_dir = "{dep["base"]}"
"""
    )
    return path


class RateLimiterProcess(JsonLinesProcess):
    """`tensorpool ratelimiter --json` in a subprocess, its JSON lines parsed as they come."""

    def __init__(self, config: str, *extra: str) -> None:
        super().__init__(
            [sys.executable, "-m", "tensorpool", "ratelimiter", "--config", config, "--json",
             "--report-interval", "0.5", *extra],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def diagnostics(self) -> str:
        return ": " + self.stderr()

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def stop(self) -> int:
        return stop_process(self.proc, 20)[0]


def consumer(dep: dict[str, Any], stream_id: int, descriptors: int) -> Consumer:
    settings = ClientSettings(
        transport=dep["ctx"].config,
        channels=Endpoints(control_channel=CONTROL, descriptor_stream_id=descriptors),
        shm_base_dir=dep["base"],
    )
    return Consumer(dep["ctx"], stream_id, settings, driver=True)


def test_e2e_driver_producer_ratelimiter_consumer(deployment: dict[str, Any]) -> None:
    """Real processes: the destination gets a slowed-down copy of the 1 kHz source — every
    frame carrying its source seq (§4: gaps for throttled frames), its source timestamp and
    meta_version, its own payload (§5), on the rate limiter's own epoch (§7), with the
    source's metadata forwarded (§6)."""
    rl = RateLimiterProcess(rl_toml(deployment, 20050))
    try:
        started = rl.wait_event("started")
        dest_epoch = started["mappings"][0]["dest_epoch"]
        assert dest_epoch >= 1
        src = consumer(deployment, SOURCE, 1100)
        dst = consumer(deployment, 20050, DEST_DESCRIPTORS)
        src_ts: dict[int, tuple[int, int]] = {}
        got: list[tuple[int, int, int, int, int]] = []

        def on_src(f: Frame) -> None:
            src_ts[f.seq] = (f.timestamp_ns, f.meta_version)

        def on_dst(f: Frame) -> None:
            stamp = int(np.frombuffer(f.array.reshape(-1)[:8].tobytes(), "<i8")[0])
            if f.is_current():
                got.append((f.seq, f.timestamp_ns, f.meta_version, stamp, f.epoch))

        deadline = time.monotonic() + 30
        while len(got) < 25 or dst.meta_version is None:
            assert time.monotonic() < deadline, (len(got), rl.events[-1:])
            src.poll(on_src)
            dst.poll(on_dst)
            time.sleep(0.0005)
        for _ in range(50):  # the source side of the last frames
            src.poll(on_src)
            time.sleep(0.001)
        seqs = [g[0] for g in got]
        assert seqs == sorted(set(seqs)), "destination seqs must increase"
        assert all(g[3] == g[0] for g in got), "payload stamp == seq: the right frame copied"
        assert all(g[4] == dest_epoch for g in got)
        matched = [g for g in got if g[0] in src_ts]
        assert len(matched) >= len(got) // 2
        for seq, ts, mv, _, _ in matched:
            assert (ts, mv) == src_ts[seq], "timestamp_ns and meta_version preserved"
        assert dst.drops_gap > 5 * len(got), "throttled frames are sequence gaps"
        assert dst.metadata.get("gain") == ("text/plain", b"2.5")
        assert dst.meta_version == src.meta_version
        src.close()
        dst.close()
    finally:
        assert rl.stop() == 0
    stopped = rl.wait_event("stopped")
    m = stopped["mappings"][0]
    assert m["published"] >= 25 and m["superseded"] > m["published"]


def test_s3_second_rate_limiter_on_same_destination_is_rejected(
    deployment: dict[str, Any],
) -> None:
    """§3 MUST: exclusive producer of the destination: the driver refuses a second rate
    limiter for the same destination stream, which exits non-zero without running (after
    waiting out its --attach-timeout: the lease might have been a crashed one's, #13.3)."""
    first = RateLimiterProcess(rl_toml(deployment, 20060, instance="rl-a"))
    try:
        first.wait_event("started")
        second = RateLimiterProcess(
            rl_toml(deployment, 20060, instance="rl-b"), "--attach-timeout", "2"
        )
        assert second.proc.wait(30) == 1
        err = second.stderr()
        assert "REJECTED" in err and "already has a producer" in err
        assert not second.events
    finally:
        assert first.stop() == 0


def test_s7_restart_gets_a_higher_destination_epoch(deployment: dict[str, Any]) -> None:
    """§7 MUST: the destination epoch is the rate limiter's own and increases on restart."""
    epochs = []
    for _ in range(2):
        rl = RateLimiterProcess(rl_toml(deployment, 20070, instance="rl-restart"))
        try:
            epochs.append(rl.wait_event("started")["mappings"][0]["dest_epoch"])
        finally:
            assert rl.stop() == 0
    assert epochs[1] > epochs[0] >= 1
