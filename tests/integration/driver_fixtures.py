"""Test-side helpers for the SHM driver daemon: config files, the daemon process, a raw client.

`DriverProcess` runs the real daemon (`python -m tensorpool driver --config ...`) in a
subprocess with its log in a file (a pipe nobody reads could block it). `ControlClient` speaks
the driver control protocol (schema 901) with the generated encoders over a real Aeron client,
and records every driver message it sees on the control stream in arrival order, so tests can
assert on ordering (revocation before the epoch-bumped announce) and correlate responses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyaeron

from tensorpool.specs import CodecError, peek_header
from tensorpool.specs.generated import driver as drv
from tensorpool.specs.generated import wire
from tensorpool.transport.process import PARENT_ENV, stop_process
from tensorpool.transport.publication import Publisher
from tensorpool.transport.subscription import Subscriber

PRODUCER = int(drv.Role.PRODUCER)
CONSUMER = int(drv.Role.CONSUMER)
OK = int(drv.ResponseCode.OK)
UNSUPPORTED = int(drv.ResponseCode.UNSUPPORTED)
INVALID_PARAMS = int(drv.ResponseCode.INVALID_PARAMS)
REJECTED = int(drv.ResponseCode.REJECTED)
REQUIRE_EXISTING = int(drv.PublishMode.REQUIRE_EXISTING)
EXISTING_OR_CREATE = int(drv.PublishMode.EXISTING_OR_CREATE)
CONTROL_CHANNEL = "aeron:ipc?term-length=1m"
CONTROL_STREAM = 1000
INSTANCE = "drv-it"


def driver_toml(
    base_dir: str,
    aeron_dir: str,
    *,
    embedded: bool = False,
    instance_id: str = INSTANCE,
    streams: Iterable[int] = range(10000, 10010),
    policies: dict[str, object] | None = None,
    control_stream_id: int = CONTROL_STREAM,
) -> str:
    """A small, fast config: 100 ms keepalive x 3, 200 ms announces, tiny regions."""
    pol: dict[str, object] = {
        "allow_dynamic_streams": True,
        "announce_period_ms": 200,
        "lease_keepalive_interval_ms": 100,
        "lease_expiry_grace_intervals": 3,
        "shutdown_timeout_ms": 200,
        "shutdown_token": "s3cret",
        "epoch_gc_keep": 2,
        "epoch_gc_min_age_ns": 300_000_000,
    }
    pol.update(policies or {})
    lines = [
        "[driver]",
        f'instance_id = "{instance_id}"',
        f'aeron_dir = "{aeron_dir}"',
        f"embedded_media_driver = {'true' if embedded else 'false'}",
        f'control_channel = "{CONTROL_CHANNEL}"',
        f"control_stream_id = {control_stream_id}",
        'stream_id_range = "20000-20099"',
        "",
        "[shm]",
        f'base_dir = "{base_dir}"',
        'permissions_mode = "600"',
        "",
        "[policies]",
    ]
    for key, value in pol.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        else:
            lines.append(f"{key} = {value}")
    lines += [
        "",
        "[profiles.small]",
        "header_nslots = 16",
        "payload_pools = [{ pool_id = 1, stride_bytes = 4096 }, "
        "{ pool_id = 2, stride_bytes = 65536 }]",
    ]
    for sid in streams:
        lines += ["", f"[streams.s{sid}]", f"stream_id = {sid}", 'profile = "small"']
    return "\n".join(lines) + "\n"


@contextmanager
def embedded_driver_work(prefix: str, control: str) -> Iterator[dict[str, str]]:
    """A fresh directory (on /dev/shm when there is one) with a driver config: embedded media
    driver, ``control`` as its control channel, and lease timings generous enough that a loaded
    host never expires a lease on its own (100 ms x 3 lost one under a parallel Spark run).
    Paths: ``root``, ``aeron``, ``base`` (SHM), ``config``; removed afterwards."""
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = tempfile.mkdtemp(prefix=prefix, dir=shm_root)
    paths = {
        "root": root,
        "aeron": os.path.join(root, "aeron"),
        "base": os.path.join(root, "shm"),
        "config": os.path.join(root, "driver.toml"),
    }
    policies = {"lease_keepalive_interval_ms": 200, "lease_expiry_grace_intervals": 25}
    text = driver_toml(paths["base"], paths["aeron"], embedded=True, policies=policies)
    Path(paths["config"]).write_text(text.replace('"aeron:ipc?term-length=1m"', f'"{control}"'))
    try:
        yield paths
    finally:
        shutil.rmtree(root, ignore_errors=True)


def status_file(base_dir: str) -> str:
    return os.path.join(base_dir, "default", "driver-status.json")


def read_status(base_dir: str) -> dict[str, Any] | None:
    try:
        with open(status_file(base_dir)) as f:
            return json.load(f)  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run `python -m tensorpool ...` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "tensorpool", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class DriverProcess:
    """The daemon in a subprocess; readiness = its status file says RUNNING with its pid."""

    def __init__(self, config_path: str, base_dir: str, log_path: str) -> None:
        self.config_path = config_path
        self.base_dir = base_dir
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> DriverProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tensorpool",
                    "driver",
                    "--config",
                    self.config_path,
                    *extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # a daemon outlives its launcher; one started by a test stops with it, even
                # when pytest itself is killed and its fixtures never run
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 20.0) -> DriverProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = read_status(self.base_dir)
            if doc and doc.get("pid") == self.proc.pid and doc.get("state") == "RUNNING":
                return self
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"driver exited with {self.proc.returncode}:\n{self.log_text()}"
                )
            time.sleep(0.02)
        raise AssertionError(f"driver not ready after {timeout} s:\n{self.log_text()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc)[0]


@dataclass
class Msg:
    """One driver message seen on the control stream (fields copied out of the decoder)."""

    index: int
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def _decode(buffer: Any) -> tuple[str, dict[str, Any]] | None:
    _, template_id, schema_id, _ = peek_header(buffer)
    if schema_id == drv.SCHEMA_ID:
        if template_id == drv.ShmAttachResponseDecoder.TEMPLATE_ID:
            d = drv.ShmAttachResponseDecoder().wrap(buffer)
            return "attach_response", {
                "correlation_id": d.correlation_id,
                "code": d.code_raw,
                "lease_id": d.lease_id,
                "lease_expiry_timestamp_ns": d.lease_expiry_timestamp_ns,
                "stream_id": d.stream_id,
                "epoch": d.epoch,
                "layout_version": d.layout_version,
                "header_nslots": d.header_nslots,
                "header_slot_bytes": d.header_slot_bytes,
                "max_dims": d.max_dims,
                "payload_pools": [
                    (p.pool_id, p.pool_nslots, p.stride_bytes, p.region_uri)
                    for p in d.payload_pools
                ],
                "header_region_uri": d.header_region_uri,
                "error_message": d.error_message,
            }
        if template_id == drv.ShmDetachResponseDecoder.TEMPLATE_ID:
            d2 = drv.ShmDetachResponseDecoder().wrap(buffer)
            return "detach_response", {
                "correlation_id": d2.correlation_id,
                "code": d2.code_raw,
                "error_message": d2.error_message,
            }
        if template_id == drv.ShmLeaseRevokedDecoder.TEMPLATE_ID:
            d3 = drv.ShmLeaseRevokedDecoder().wrap(buffer)
            return "revoked", {
                "lease_id": d3.lease_id,
                "stream_id": d3.stream_id,
                "client_id": d3.client_id,
                "role": d3.role_raw,
                "reason": d3.reason_raw,
                "timestamp_ns": d3.timestamp_ns,
            }
        if template_id == drv.ShmDriverShutdownDecoder.TEMPLATE_ID:
            d4 = drv.ShmDriverShutdownDecoder().wrap(buffer)
            return "shutdown", {"reason": d4.reason_raw, "error_message": d4.error_message}
        return None  # requests (ours and other tests')
    if schema_id == wire.SCHEMA_ID and template_id == wire.ShmPoolAnnounceDecoder.TEMPLATE_ID:
        a = wire.ShmPoolAnnounceDecoder().wrap(buffer)
        return "announce", {
            "stream_id": a.stream_id,
            "producer_id": a.producer_id,
            "epoch": a.epoch,
            "announce_timestamp_ns": a.announce_timestamp_ns,
            "header_nslots": a.header_nslots,
            "header_slot_bytes": a.header_slot_bytes,
            "header_region_uri": a.header_region_uri,
            "payload_pools": [
                (p.pool_id, p.pool_nslots, p.stride_bytes, p.region_uri) for p in a.payload_pools
            ],
        }
    return None


class ControlClient:
    """A raw control-plane client: encode requests, record everything the driver says.

    The Aeron client gets an error handler: Aeron's default one calls ``exit()`` when the media
    driver goes away, which an embedded-media-driver daemon does when it stops.
    """

    def __init__(
        self, aeron_dir: str, *, channel: str = CONTROL_CHANNEL, stream_id: int = CONTROL_STREAM
    ) -> None:
        self.aeron_errors: list[tuple[int, str]] = []
        self.aeron = pyaeron.Aeron(
            context=pyaeron.Context(dir=aeron_dir, error_handler=self._on_aeron_error)
        )
        self.messages: list[Msg] = []
        self.undecodable = 0
        self._buf = bytearray(1 << 20)
        self._next_corr = int(time.time_ns() & 0xFFFFFFFF) << 16
        self.sub = Subscriber(self.aeron, channel, stream_id, self._on_message, fragment_limit=256)
        self.pub = Publisher(self.aeron.add_exclusive_publication(channel, stream_id))

    def _on_aeron_error(self, code: int, message: str) -> None:
        self.aeron_errors.append((code, message))

    def close(self) -> None:
        self.sub.close()
        self.pub.close()
        self.aeron.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receive -----------------------------------------------------------------------------
    def _on_message(self, buffer: Any, header: Any) -> None:
        try:
            decoded = _decode(buffer)
        except CodecError:
            self.undecodable += 1
            return
        if decoded is not None:
            self.messages.append(Msg(len(self.messages), *decoded))

    def poll(self) -> int:
        return self.sub.poll()

    def wait_connected(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not (self.pub.is_connected and self.sub.image_count > 1):
            # >1: our own publication's image and the driver's
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"control stream not connected to the driver: pub={self.pub.is_connected} "
                    f"images={self.sub.image_count}"
                )
            time.sleep(0.01)

    def wait_for(self, pred: Callable[[Msg], bool], timeout: float = 5.0, *, start: int = 0) -> Msg:
        deadline = time.monotonic() + timeout
        checked = start
        while True:
            while checked < len(self.messages):
                msg = self.messages[checked]
                checked += 1
                if pred(msg):
                    return msg
            if time.monotonic() > deadline:
                kinds = [(m.kind, m.fields.get("stream_id")) for m in self.messages[start:]][-20:]
                raise AssertionError(f"no matching message within {timeout} s; last: {kinds}")
            if not self.poll():
                time.sleep(0.001)

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self.poll():
                time.sleep(0.002)

    # -- send --------------------------------------------------------------------------------
    def corr(self) -> int:
        self._next_corr += 1
        return self._next_corr

    def send(self, data: bytes | bytearray | memoryview, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.pub.offer(data):
            if time.monotonic() > deadline:
                raise AssertionError(f"offer failed: {self.pub.counters}")
            self.poll()
            time.sleep(0.001)

    def attach_bytes(
        self,
        stream_id: int,
        client_id: int,
        role: int,
        *,
        correlation_id: int,
        mode: int | None = REQUIRE_EXISTING,
        expected_layout_version: int = 0,
        max_dims: int = 0,
        require_hugepages: int = 0,
    ) -> bytes:
        n = drv.ShmAttachRequestEncoder.encode(
            self._buf,
            0,
            correlation_id=correlation_id,
            stream_id=stream_id,
            client_id=client_id,
            role=role,
            expected_layout_version=expected_layout_version,
            max_dims=max_dims,
            publish_mode=mode,
            require_hugepages=require_hugepages,
        )
        return bytes(self._buf[:n])

    def attach(
        self, stream_id: int, client_id: int, role: int, *, timeout: float = 10.0, **kw: Any
    ) -> Msg:
        corr = self.corr()
        start = len(self.messages)
        self.send(self.attach_bytes(stream_id, client_id, role, correlation_id=corr, **kw))
        return self.response("attach_response", corr, timeout=timeout, start=start)

    def response(self, kind: str, corr: int, *, timeout: float = 10.0, start: int = 0) -> Msg:
        return self.wait_for(
            lambda m: m.kind == kind and m["correlation_id"] == corr, timeout, start=start
        )

    def keepalive(self, lease: Msg, client_id: int, role: int) -> None:
        n = drv.ShmLeaseKeepaliveEncoder.encode(
            self._buf,
            0,
            lease_id=lease["lease_id"],
            stream_id=lease["stream_id"],
            client_id=client_id,
            role=role,
            client_timestamp_ns=time.monotonic_ns(),
        )
        self.send(self._buf[:n])

    def detach(self, lease: Msg, client_id: int, role: int, *, timeout: float = 5.0) -> Msg:
        corr = self.corr()
        start = len(self.messages)
        n = drv.ShmDetachRequestEncoder.encode(
            self._buf,
            0,
            correlation_id=corr,
            lease_id=lease["lease_id"],
            stream_id=lease["stream_id"],
            client_id=client_id,
            role=role,
        )
        self.send(self._buf[:n])
        return self.response("detach_response", corr, timeout=timeout, start=start)

    def shutdown_request_bytes(self, token: str | bytes, message: str = "") -> bytes:
        n = drv.ShmDriverShutdownRequestEncoder.encode(
            self._buf,
            0,
            correlation_id=self.corr(),
            reason=int(drv.ShutdownReason.ADMIN),
            token=token,
            error_message=message,
        )
        return bytes(self._buf[:n])

    def keep_alive_for(
        self, seconds: float, leases: list[tuple[Msg, int, int]], interval: float = 0.05
    ) -> None:
        """Send keepalives for ``(lease, client_id, role)`` every ``interval`` while polling."""
        end = time.monotonic() + seconds
        next_ka = 0.0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_ka:
                for lease, client_id, role in leases:
                    self.keepalive(lease, client_id, role)
                next_ka = now + interval
            if not self.poll():
                time.sleep(0.002)
