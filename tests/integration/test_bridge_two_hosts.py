"""Two "hosts" on one machine, bridged over real UDP on 127.0.0.1 (Bridge Spec v1.0).

Each host has its own Aeron media driver process, its own `tensorpool driver` daemon and its
own SHM base directory; nothing is shared but the loopback interface. Host A runs a producer
of stream 10000 (in this test process, attached through driver A) and `tensorpool bridge`
with a sender mapping; host B runs `tensorpool bridge` with the receiver mapping into stream
20000 (attached through driver B as its exclusive producer) and a consumer of 20000 (in this
test process, attached through driver B). Assertions are about what arrives — never speed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from driver_fixtures import DriverProcess
from netports import free_udp_ports

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.shm.tensor import WIRE_TO_NUMPY
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.slow

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
SRC = 10000
DEST = 20000
SRC2 = 10001  # second mapping: destination allocated from dest_stream_id_range
RANGE = (50000, 50001)
SRC_PROGRESS = 1201  # host A's local stream carrying FrameProgress for the mapping
DEST_PROGRESS = 2201  # host B's
NSLOTS_B = 32
# Long leases: the tests are about the bridge, not lease timing on a loaded 2-core host.
POLICIES = """
[policies]
allow_dynamic_streams = false
announce_period_ms = 200
lease_keepalive_interval_ms = 1000
lease_expiry_grace_intervals = 60
shutdown_timeout_ms = 200
"""


def driver_config(base: str, aeron_dir: str, stream_ids: list[int], nslots: int, name: str) -> str:
    streams = "".join(
        f'\n[streams.s{sid}]\nstream_id = {sid}\nprofile = "cam"\n' for sid in stream_ids
    )
    return f"""
[driver]
instance_id = "{name}"
aeron_dir = "{aeron_dir}"
embedded_media_driver = false

[shm]
base_dir = "{base}"
allowed_base_dirs = ["{base}"]
permissions_mode = "600"
{POLICIES}
[profiles.cam]
header_nslots = {nslots}
payload_pools = [{{ pool_id = 1, stride_bytes = 65536 }}, {{ pool_id = 2, stride_bytes = 1048576 }}]

{streams}"""


def bridge_config(host: Host, role: str, ports: list[int]) -> str:
    p_payload, p_control, p_meta = ports
    rx = ""  # Aeron's default window: no dependence on the host's net.core.rmem_max
    return f"""
[bridge]
instance_id = "bridge-{host.name}"
role = "{role}"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{p_payload}|term-length=16m{rx}"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:{p_control}"
control_stream_id = 3001
metadata_channel = "aeron:udp?endpoint=127.0.0.1:{p_meta}"
metadata_stream_id = 3002
forward_progress = true
assembly_timeout_ms = 5000  # generous: a loaded CI host must not time frames out here
dest_stream_id_range = "{RANGE[0]}-{RANGE[1]}"

[local]
aeron_dir = "{host.md.dir}"
driver_mode = true
shm_base_dir = "{host.base}"
allowed_base_dirs = ["{host.base}"]
announce_period_ms = 200

[[mappings]]
source_stream_id = {SRC}
dest_stream_id = {DEST}
profile = "cam"
source_control_stream_id = {SRC_PROGRESS}
dest_control_stream_id = {DEST_PROGRESS}

[[mappings]]
source_stream_id = {SRC2}
dest_stream_id = 0
profile = "cam"
source_control_stream_id = {SRC_PROGRESS + 1}
dest_control_stream_id = {DEST_PROGRESS + 1}
"""


@dataclass
class Host:
    name: str
    work: str
    md: MediaDriverProcess
    driver: DriverProcess
    ctx: AeronContext
    settings: ClientSettings

    @property
    def base(self) -> str:
        return self.driver.base_dir


class BridgeProcess:
    """`tensorpool bridge --json` in a subprocess; its JSON status lines parsed on demand."""

    def __init__(self, config_path: str, log_path: str) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.out_path = log_path + ".jsonl"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BridgeProcess:
        with open(self.out_path, "ab") as out, open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tensorpool", "-v", "bridge", "--config",
                 self.config_path, "--json", "--report-interval", "0.2"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip
        return self

    def rows(self) -> list[dict[str, Any]]:
        try:
            with open(self.out_path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def last(self, mapping: str = f"{SRC}->{DEST}") -> dict[str, Any] | None:
        rows = [r for r in self.rows() if r["mapping"] == mapping]
        return rows[-1] if rows else None

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc, 20)[0]


@dataclass
class Deployment:
    a: Host
    b: Host
    bridge_a: BridgeProcess
    bridge_b: BridgeProcess
    producer: Producer
    consumer: Consumer
    squatter: Producer
    received: list[dict[str, Any]] = field(default_factory=list)
    epochs_b: list[int] = field(default_factory=list)

    def on_frame(self, f: Frame) -> None:
        data = f.array.tobytes(order="A") if f.values_len_bytes else b""
        shape, dtype = f.shape, WIRE_TO_NUMPY[f.dtype]
        if f.is_current():
            self.received.append(
                {"seq": f.seq, "epoch": f.epoch, "ts": f.timestamp_ns, "shape": shape,
                 "dtype": dtype, "data": data, "meta_version": f.meta_version}
            )  # fmt: skip

    def ready(self) -> bool:
        """Sender mapped to the producer's epoch and announcing, receiver's destination open,
        host B's consumer mapped to the receiver's local epoch."""
        tx, rx = self.bridge_a.last(), self.bridge_b.last()
        return (
            tx is not None
            and tx["source_epoch"] == self.producer.epoch
            and tx["announces"] > 0
            and rx is not None
            and rx["local_epoch"] is not None
            and rx["source_epoch"] == self.producer.epoch
            and self.consumer.epoch == rx["local_epoch"]
        )

    def pump(self, until: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not until():
            self.producer.do_work()
            self.consumer.poll(self.on_frame)
            epoch = self.consumer.epoch
            if epoch is not None and (not self.epochs_b or self.epochs_b[-1] != epoch):
                self.epochs_b.append(epoch)
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}\nproducer: epoch {self.producer.epoch} "
                    f"{self.producer.stats} consumer: epoch {self.consumer.epoch} "
                    f"{self.consumer.stats}\nA: {self.bridge_a.last()}\n"
                    f"B: {self.bridge_b.last()}\nB log:\n{self.bridge_b.log_text()[-3000:]}"
                    f"\nA log:\n{self.bridge_a.log_text()[-3000:]}"
                )
            time.sleep(0.001)


def _host(name: str, stream_ids: list[int], nslots: int) -> Host:
    work = tempfile.mkdtemp(prefix=f"tp-bridge-{name}-", dir=SHM_ROOT)
    md = MediaDriverProcess().start()
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(driver_config(base, md.dir, stream_ids, nslots, f"drv-{name}"))
    driver = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start()
    ctx = AeronContext(TransportConfig(aeron_dir=md.dir)).start()
    settings = ClientSettings(
        transport=ctx.config, shm_base_dir=base, namespace="default", announce_period_ns=200_000_000
    )
    return Host(name, work, md, driver, ctx, settings)


@pytest.fixture(scope="module")
def dep() -> Iterator[Deployment]:
    hosts: list[Host] = []
    bridges: list[BridgeProcess] = []
    producer = consumer = squatter = None
    try:
        a = _host("hostA", [SRC, SRC2], 64)
        hosts.append(a)
        b = _host("hostB", [DEST, *RANGE], NSLOTS_B)
        hosts.append(b)
        a.driver.wait_ready()
        b.driver.wait_ready()
        # §4: the first allocated destination already has a producer: the bridge must remap
        squatter = Producer(b.ctx, RANGE[0], b.settings, driver=True)
        squatter.wait_until_attached()  # #14.1: construction does not block
        ports = free_udp_ports(3)
        for host, role in ((b, "receiver"), (a, "sender")):
            path = os.path.join(host.work, "bridge.toml")
            Path(path).write_text(bridge_config(host, role, ports))
            bridges.append(BridgeProcess(path, os.path.join(host.work, "bridge.log")).start())
        producer = Producer(a.ctx, SRC, a.settings, driver=True)
        producer.wait_until_attached()  # #14.1: construction does not block
        producer.set_metadata({"camera": "front", "gain": ("application/json", b"2.5")})
        consumer = Consumer(b.ctx, DEST, b.settings, driver=True)
        d = Deployment(a, b, bridges[1], bridges[0], producer, consumer, squatter)
        d.pump(d.ready, what="the whole chain")
        yield d
    finally:
        for br in bridges:
            br.stop()
        for obj in (consumer, producer, squatter):
            if obj is not None:
                obj.close()
        for host in hosts:
            host.ctx.close()
            host.driver.stop()
            host.md.stop()
            shutil.rmtree(host.work, ignore_errors=True)


def _frames(first_seq: int) -> list[np.ndarray]:
    """Mixed sizes (one chunk, many chunks, 640 KiB, empty), dtypes and shapes."""
    rng = np.random.default_rng(first_seq)
    return [
        rng.standard_normal((640, 256)).astype("<f4"),  # 640 KiB: 512 chunks
        rng.integers(0, 2**16, (100, 33), dtype="<u2"),
        np.arange(160, dtype="<i8"),  # 1280 bytes: exactly one chunk
        np.zeros((0,), "<f8"),  # empty payload
        np.asfortranarray(rng.integers(-100, 100, (17, 5, 3), dtype="<i4")),
        rng.integers(0, 255, (300_000,), dtype="u1"),
    ]


def _produce(d: Deployment, arrays: list[np.ndarray], ts0: int) -> list[dict[str, Any]]:
    sent = []
    start = len(d.received)
    for i, arr in enumerate(arrays):
        seq = d.producer.offer(arr, timestamp_ns=ts0 + i)
        assert seq is not None
        sent.append({"seq": seq, "ts": ts0 + i, "array": arr})
        # pace the source so nothing is dropped for lack of room (this is not a speed test)
        n = start + len(sent)
        d.pump(lambda n=n: len(d.received) >= n, what=f"frame {seq} on host B")
    return sent


def _assert_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    arr: np.ndarray = want["array"]
    assert got["seq"] == want["seq"]
    assert got["ts"] == want["ts"]
    assert got["shape"] == arr.shape
    assert got["dtype"] == arr.dtype
    assert got["data"] == arr.tobytes(order="A")


def test_s6_two_hosts_receive_identical_frames_and_metadata(dep: Deployment) -> None:
    """Frames produced on host A reach host B's consumer identical in content, shape, dtype,
    timestamp and seq (§6: seq preserved, local pool/slot); metadata arrives on host B with
    the stream id rewritten to 20000 and meta_version preserved (§7.1)."""
    d = dep
    start = len(d.received)
    sent = _produce(d, _frames(1), ts0=1_700_000_000_000_000_000)
    got = d.received[start:]
    assert len(got) == len(sent)
    for g, w in zip(got, sent, strict=True):
        _assert_identical(g, w)
    assert {g["epoch"] for g in got} == {d.consumer.epoch}
    d.pump(lambda: d.consumer.meta_version == d.producer.meta_version, what="metadata on B")
    assert d.consumer.metadata == {
        "camera": ("text/plain", b"front"),
        "gain": ("application/json", b"2.5"),
    }
    rx = d.bridge_b.last()
    assert rx is not None and rx["role"] == "receiver" and rx["dest_stream_id"] == DEST


def test_s9_two_hosts_progress_forwarded_with_local_ids(dep: Deployment) -> None:
    """FrameProgress seen on host A's source_control_stream_id is republished on host B's
    dest_control_stream_id with stream id 20000 and the header index of B's ring; epoch,
    frame id, bytes filled and state are preserved."""
    d = dep
    got: list[tuple[int, ...]] = []

    def on_local(buffer: object, header: object) -> None:
        got.append(wire.FrameProgressDecoder.decode_tuple(buffer))  # type: ignore[arg-type]

    sub = d.b.ctx.add_subscription(d.b.settings.channels.control_channel, DEST_PROGRESS, on_local)
    pub = d.a.ctx.add_publication(d.a.settings.channels.control_channel, SRC_PROGRESS)
    buf = bytearray(64)
    frame_id = d.producer.next_seq + 1000  # a frame not yet finished on host B
    n = wire.FrameProgressEncoder.encode(
        buf, 0, stream_id=SRC, epoch=d.producer.epoch, frame_id=frame_id,
        header_index=frame_id & 63, payload_bytes_filled=8192,
        state=int(wire.FrameProgressState.PROGRESS),
    )  # fmt: skip

    def delivered() -> bool:
        pub.offer(buf, 0, n)
        sub.poll()
        return bool(got)

    d.pump(delivered, what="FrameProgress on host B")
    stream_id, epoch, fid, header_index, filled, state = got[0]
    assert (stream_id, epoch, fid, filled) == (DEST, d.producer.epoch, frame_id, 8192)
    assert state == int(wire.FrameProgressState.PROGRESS)
    assert header_index == frame_id & (NSLOTS_B - 1)


def test_s4_allocated_destination_with_a_producer_is_remapped(dep: Deployment) -> None:
    """dest_stream_id = 0 takes the first free id of dest_stream_id_range (50000); that
    stream already has an exclusive producer on host B, so the bridge moves to 50001."""
    d = dep
    name = f"{SRC2}->{RANGE[0]}"

    def opened() -> bool:
        row = d.bridge_b.last(name)
        return row is not None and row["local_epoch"] is not None

    d.pump(opened, what="the allocated mapping's destination")
    row = d.bridge_b.last(name)
    assert row is not None
    assert row["dest_stream_id"] == RANGE[1]
    assert row["open_failures"] >= 1


def test_s4_s8_receiver_restart_fails_on_taken_destination_then_higher_epoch(
    dep: Deployment,
) -> None:
    """Restarting host B's bridge while another producer holds stream 20000: the static
    destination is not taken over (attach refused, retried); once it is free the bridge
    attaches with a higher local epoch (independent of the unchanged source epoch),
    consumers remap and frames keep arriving."""
    d = dep
    before = d.consumer.epoch
    assert before is not None
    source_epoch = d.producer.epoch
    d.bridge_b.stop()
    intruder = Producer(d.b.ctx, DEST, d.b.settings, driver=True)
    intruder.wait_until_attached()  # #14.1: construction does not block
    try:
        d.bridge_b.start()

        def refused() -> bool:
            row = d.bridge_b.last()
            return row is not None and row["open_failures"] >= 1 and row["local_epoch"] is None

        d.pump(refused, what="the bridge refused the taken destination")
        assert "producer" in d.bridge_b.last()["last_error"]  # type: ignore[index]
    finally:
        intruder.close()
    d.pump(
        lambda: d.consumer.epoch is not None and d.consumer.epoch > before and d.ready(),
        what="host B consumer remapped to a higher epoch",
    )
    start = len(d.received)
    sent = _produce(d, _frames(2)[:3], ts0=1_800_000_000_000_000_000)
    got = d.received[start:]
    for g, w in zip(got, sent, strict=True):
        _assert_identical(g, w)
        assert g["epoch"] > before
    assert d.producer.epoch == source_epoch
    rx = d.bridge_b.last()
    assert rx is not None and rx["local_epoch"] > before and rx["source_epoch"] == source_epoch
