"""One destination's attach does not stall the receiver's other streams (Bridge Spec §4).

Real parts only: a standalone Aeron media driver, the real `tensorpool driver` daemon as
host B's SHM driver, a real :class:`BridgeApp` (receiver role, driver mode) in this process
fed over real UDP on 127.0.0.1 with hand-made chunks, and a real driver-mode
:class:`Consumer` of stream A's destination.

Stream B's attach is held back for real: the SHM driver is stopped (SIGSTOP) before B's
first announce arrives, so B's attach request goes unanswered. Stream A, attached before,
must keep delivering frames to its local consumer while B is still attaching — B's chunks
are dropped as ``destination_attaching`` meanwhile. Once the driver runs again B attaches
and its frames arrive. With the old blocking attach (``wait_until_attached`` inside the
receiver's duty cycle) A's frames only arrive after B's attach has timed out (B then shows
an open failure), which the test refuses. No timing thresholds: every wait is on a condition.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bridge_wire import header_slot
from driver_fixtures import DriverProcess, driver_toml, read_status
from netports import free_udp_ports

from tensorpool.bridge.app import BridgeApp
from tensorpool.bridge.chunker import Chunker
from tensorpool.bridge.config import parse_bridge_config
from tensorpool.bridge.reasons import ChunkDrop
from tensorpool.client.consumer import Consumer, Frame
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.publication import Publisher

pytestmark = pytest.mark.slow

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
SRC_A, SRC_B = 10100, 10101
DEST_A, DEST_B = 20100, 20101
CHUNK = 1280


@dataclass
class Rig:
    driver: DriverProcess
    ctx: AeronContext
    app: BridgeApp
    payload: Publisher
    control: Publisher
    consumer: Consumer
    seen: list[int] = field(default_factory=list)
    _buf: bytearray = field(default_factory=lambda: bytearray(4096))

    def row(self, src: int) -> dict[str, Any]:
        return next(r for r in self.app.status() if r["source_stream_id"] == src)

    def pump(self, until: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            self.app.do_work()
            self.consumer.poll(self._take)
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}\nA: {self.row(SRC_A)}\nB: {self.row(SRC_B)}"
                    f"\nconsumer epoch {self.consumer.epoch}, seen {self.seen}, "
                    f"{self.consumer.stats}"
                )
            time.sleep(0.0005)

    def _take(self, f: Frame) -> None:
        if f.is_current():
            self.seen.append(f.seq)

    def send(self, pub: Publisher, msg: bytes) -> None:
        deadline = time.monotonic() + 10
        while not pub.offer(msg):
            assert time.monotonic() < deadline, f"offer failed: {pub.counters}"
            self.app.do_work()
            time.sleep(0.001)

    def announce(self, src: int, epoch: int = 1) -> None:
        n = wire.ShmPoolAnnounceEncoder.encode(
            self._buf, 0, stream_id=src, producer_id=9, epoch=epoch,
            announce_timestamp_ns=time.monotonic_ns(), announce_clock_domain=1,
            layout_version=1, header_nslots=16, header_slot_bytes=256,
            payload_pools=[(1, 16, 65536, "shm:file?path=/nonexistent/on/this/host")],
            header_region_uri="shm:file?path=/nonexistent/on/this/host",
        )  # fmt: skip
        self.send(self.control, bytes(self._buf[:n]))

    def frame(self, src: int, seq: int, epoch: int = 1) -> None:
        """A 3-chunk frame of ``src`` (fits the driver's 4 KiB pool)."""
        arr = np.arange(900, dtype="<i4") + seq
        raw = arr.tobytes()
        hdr = header_slot(seq, TensorLayout.from_array(arr), len(raw), 1_000_000 + seq, nslots=16)
        for msg in Chunker(CHUNK).encode_frame(
            stream_id=src, epoch=epoch, seq=seq, header=hdr, payload=raw
        ):
            self.send(self.payload, msg)


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The rig; ``request.param`` is the receiver's ``attach_timeout_ms`` (default 60 s)."""
    attach_timeout_ms = getattr(request, "param", 60_000)
    work = tempfile.mkdtemp(prefix="tp-bridge-attach-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    md = MediaDriverProcess().start()
    driver = ctx = app = consumer = None
    try:
        cfg_path = os.path.join(work, "driver.toml")
        # 2 s leases: a stop that outlasts the client's 2 s attach request timeout makes the
        # resumed driver grant the first request late (the client takes it: see
        # test_driver_late_grant.py); short leases bound any lease a failed open leaves behind
        policies = {"lease_keepalive_interval_ms": 500, "lease_expiry_grace_intervals": 4}
        Path(cfg_path).write_text(
            driver_toml(base, md.dir, streams=[DEST_A, DEST_B], policies=policies)
        )
        driver = DriverProcess(cfg_path, base, os.path.join(work, "driver.log")).start()
        driver.wait_ready()
        ports = free_udp_ports(2)
        cfg = parse_bridge_config(
            {
                "bridge": {
                    "instance_id": "rx-attach",
                    "role": "receiver",
                    "payload_channel": f"aeron:udp?endpoint=127.0.0.1:{ports[0]}",
                    "payload_stream_id": 3000,
                    "control_channel": f"aeron:udp?endpoint=127.0.0.1:{ports[1]}",
                    "control_stream_id": 3001,
                    "assembly_timeout_ms": 5000,
                },
                "local": {
                    "aeron_dir": md.dir,
                    "driver_mode": True,
                    "shm_base_dir": base,
                    "allowed_base_dirs": [base],
                    # the freshness window (3 periods) must outlast the driver's stop, or A's
                    # producer would call the driver silent and reattach
                    "announce_period_ms": 10_000,
                    "attach_timeout_ms": attach_timeout_ms,
                    "control_channel": "aeron:ipc?term-length=1m",
                },
                "profiles": {
                    "small": {  # the driver's profile (driver_toml)
                        "header_nslots": 16,
                        "payload_pools": [
                            {"pool_id": 1, "stride_bytes": 4096},
                            {"pool_id": 2, "stride_bytes": 65536},
                        ],
                    }
                },
                "mappings": [
                    {"source_stream_id": SRC_A, "dest_stream_id": DEST_A, "profile": "small"},
                    {"source_stream_id": SRC_B, "dest_stream_id": DEST_B, "profile": "small"},
                ],
            },
            env={},
        )
        ctx = AeronContext(TransportConfig(aeron_dir=md.dir)).start()
        app = BridgeApp(cfg, ctx=ctx)
        b = cfg.bridge
        consumer = Consumer(ctx, DEST_A, cfg.local.client_settings(), driver=True)
        yield Rig(
            driver,
            ctx,
            app,
            ctx.add_publication(b.payload_channel, b.payload_stream_id),
            ctx.add_publication(b.control_channel, b.control_stream_id),
            consumer,
        )
    finally:
        if driver is not None:
            driver.signal(signal.SIGCONT)
        for obj in (consumer, app, ctx):
            if obj is not None:
                obj.close()
        if driver is not None:
            driver.stop()
        md.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_s4_held_attach_of_one_destination_does_not_stall_another(rig: Rig) -> None:
    """(attach timeout 60 s: B must still be attaching, not failed, when A's frames arrive)"""
    r = rig
    r.announce(SRC_A)
    r.pump(lambda: r.row(SRC_A)["destination"] == "open", "A's destination")
    r.pump(lambda: r.consumer.epoch == r.row(SRC_A)["local_epoch"], "A's consumer on A's epoch")
    r.frame(SRC_A, 1)
    r.pump(lambda: r.seen == [1], "A's first frame")

    r.driver.signal(signal.SIGSTOP)  # B's attach request will go unanswered
    r.announce(SRC_B)
    r.pump(lambda: r.row(SRC_B)["source_epoch"] == 1, "B's announce (its attach started)")
    for seq in range(2, 6):
        r.frame(SRC_A, seq)
        r.frame(SRC_B, seq)
    r.pump(lambda: r.seen == [1, 2, 3, 4, 5], "A's frames while B attaches")
    rb = r.row(SRC_B)
    # A flowed while B was (still) attaching: no failed attempt, no destination, its chunks
    # counted under their own reason
    assert rb["destination"] == "attaching" and rb["open_failures"] == 0, rb
    assert rb["local_epoch"] is None and rb["frames"] == 0
    r.pump(
        lambda: r.row(SRC_B)["chunk_drops"].get(ChunkDrop.DESTINATION_ATTACHING, 0) == 12,
        "B's chunks dropped as destination_attaching",
    )

    r.driver.signal(signal.SIGCONT)
    r.pump(lambda: r.row(SRC_B)["destination"] == "open", "B attached after the driver resumed")
    r.frame(SRC_B, 6)
    r.pump(lambda: r.row(SRC_B)["frames"] == 1, "B's frame after the attach")
    assert r.row(SRC_B)["frame_drops"] == {}


@pytest.mark.parametrize("rig", [1000], indirect=True)
def test_s4_attach_timeout_fails_without_stalling_and_is_retried(rig: Rig) -> None:
    """No answer within ``attach_timeout_ms`` (1 s here): B's open counts as failed
    (``open_failures``, ``last_error``) once per window while A keeps delivering, and B keeps
    attaching with the same client: when the stalled driver answers, it grants B's queued
    request to B itself. (A new producer per window would have a new client id; the driver
    would grant the old one's queued request to nobody and refuse B as "already has a
    producer" until that lease expired.)"""
    r = rig
    r.announce(SRC_A)
    r.pump(lambda: r.row(SRC_A)["destination"] == "open", "A's destination")
    r.pump(lambda: r.consumer.epoch == r.row(SRC_A)["local_epoch"], "A's consumer on A's epoch")
    r.driver.signal(signal.SIGSTOP)
    r.announce(SRC_B)
    # three windows: past the lease machine's own 2 s request timeout, so B re-sent its attach
    r.pump(lambda: r.row(SRC_B)["open_failures"] >= 3, "B's attach timed out three times")
    rb = r.row(SRC_B)
    assert "no attach response" in rb["last_error"], rb
    assert rb["destination"] == "attaching", rb  # still attaching, not closed and rebuilt
    for seq in range(1, 4):
        r.frame(SRC_A, seq)
    r.pump(lambda: r.seen == [1, 2, 3], "A's frames while B's attach fails and retries")
    r.driver.signal(signal.SIGCONT)
    r.pump(lambda: r.row(SRC_B)["destination"] == "open", "B attached after the driver resumed")
    r.frame(SRC_B, 4)
    r.pump(lambda: r.row(SRC_B)["frames"] == 1, "B's frame after the attach")
    epoch_b = r.row(SRC_B)["local_epoch"]
    r.pump(lambda: _status_epoch(r, DEST_B) == epoch_b, "the driver's status after B's attach")
    core = (read_status(r.driver.base_dir) or {})["counters"]["core"]
    assert core.get("attach_error_producer_exists", 0) == 0, core  # met no lease of nobody


def _status_epoch(r: Rig, stream_id: int) -> int | None:
    doc = read_status(r.driver.base_dir) or {}
    for s in doc.get("streams", []):
        if s.get("stream_id") == stream_id:
            return s.get("epoch")
    return None


def test_30_reopened_destination_releases_the_lease_its_abandoned_attempt_was_granted(
    rig: Rig,
) -> None:
    """#30 soak defect (b): behind a stalled or restarting driver B, the receiver reopens a
    destination for each new source epoch, giving up on the attach in flight. The driver,
    once it runs, answers the queued request of the attempt given up on with a grant: a lease
    held for nobody. Each destination keeps one client id, so the next attempt is told
    "client id C already holds lease L", releases L and attaches; it never meets "already
    has a producer" (the driver's ``attach_error_producer_exists``), which kept the bridge
    down until that lease expired, again at every source epoch, in the soak."""
    r = rig
    r.announce(SRC_A)
    r.pump(lambda: r.row(SRC_A)["destination"] == "open", "A's destination")
    r.driver.signal(signal.SIGSTOP)
    for epoch in (2, 3):  # two source epochs while the driver is stopped: two attempts
        r.announce(SRC_A, epoch=epoch)
        r.pump(lambda e=epoch: r.row(SRC_A)["source_epoch"] == e, f"source epoch {epoch}")
        for _ in range(50):  # the new attempt's attach request goes out
            r.app.do_work()
    r.driver.signal(signal.SIGCONT)
    r.pump(lambda: r.row(SRC_A)["destination"] == "open", "A open again", timeout=60.0)
    r.pump(lambda: r.consumer.epoch == r.row(SRC_A)["local_epoch"], "A's consumer follows")
    r.frame(SRC_A, 1, epoch=3)
    r.pump(lambda: r.seen == [1], "A's frame after the reopen")
    epoch_a = r.row(SRC_A)["local_epoch"]
    r.pump(lambda: _status_epoch(r, DEST_A) == epoch_a, "the driver's status after A's attach")
    core = (read_status(r.driver.base_dir) or {})["counters"]["core"]
    assert core.get("attach_error_producer_exists", 0) == 0, core
    assert r.row(SRC_A)["open_failures"] == 0, r.row(SRC_A)
