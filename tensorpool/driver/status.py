"""The driver's status file: how ``tensorpool driver status`` sees a running driver.

Model: the agent rewrites ``<shm.base_dir>/<shm.namespace>/driver-status.json`` once per
announce period (and on start and stop), atomically — write a temporary file next to it, then
``os.replace`` — so a reader sees either the previous or the new document, never a torn one.
Reading it needs no Aeron client, no media driver and no cooperation from the driver, so the
command also works when the control plane is wedged; the price is that the data can be up to
one period old, and that a driver which died without a chance to write ``STOPPED`` leaves a
document behind. The reader therefore judges liveness itself (:func:`assess`): a document not
rewritten for ``stale_after_ns`` (3 periods, at least 3 s), or whose pid no longer exists, is
reported as stale instead of being trusted.

The document (``format`` 1) holds: identity (instance, pid, state), where to reach the driver
(Aeron directory, control and announce endpoints — ``tensorpool driver shutdown`` reads them),
streams (epoch, producer, consumer count), live leases (role, age, time to expiry) and the
counters of the core and the agent. It also carries ``next_lease_id``, which a restarted
driver uses as a lease-id high-water mark (Driver Model §4.8).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tensorpool.driver.config import DriverConfig
from tensorpool.driver.core import DriverStatus
from tensorpool.transport.process import pid_running

__all__ = [
    "STATUS_FILE_NAME",
    "STATUS_FORMAT",
    "Liveness",
    "StatusUnavailable",
    "assess",
    "build_status_document",
    "format_status",
    "read_status",
    "status_path",
    "write_status",
]

STATUS_FILE_NAME = "driver-status.json"
STATUS_FORMAT = 1
_MIN_STALE_NS = 3_000_000_000
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StatusUnavailable(Exception):
    """There is no readable status document at the path."""


def status_path(config: DriverConfig) -> str:
    """Where the driver of ``config`` publishes its status."""
    return os.path.join(config.shm.base_dir, config.shm.namespace, STATUS_FILE_NAME)


def stale_after_ns(period_ns: int) -> int:
    """How old a document may get before a reader calls the driver stale."""
    return max(3 * period_ns, _MIN_STALE_NS)


def build_status_document(
    status: DriverStatus,
    *,
    config: DriverConfig,
    pid: int,
    aeron_dir: str,
    started_unix_ns: int,
    written_unix_ns: int,
    period_ns: int,
    agent_counters: Mapping[str, int],
    live_epochs: Mapping[int, int],
) -> dict[str, Any]:
    """The JSON document for one snapshot (plain dicts, lists, str and int only)."""
    d = config.driver
    streams = []
    for s in status.streams:
        row = asdict(s)
        row["files_live"] = live_epochs.get(s.stream_id) == s.epoch and s.regions_ready
        streams.append(row)
    return {
        "format": STATUS_FORMAT,
        "instance_id": status.instance_id,
        "namespace": config.shm.namespace,
        "pid": pid,
        "state": status.state,
        "config": config.source,
        "started_unix_ns": started_unix_ns,
        "written_unix_ns": written_unix_ns,
        "stale_after_ns": stale_after_ns(period_ns),
        "monotonic_ns": status.now_ns,
        "aeron_dir": aeron_dir,
        "embedded_media_driver": d.embedded_media_driver,
        "control_channel": d.control_channel,
        "control_stream_id": d.control_stream_id,
        "announce_channel": d.announce_channel,
        "announce_stream_id": d.announce_stream_id,
        "shm_base_dir": config.shm.base_dir,
        "announce_period_ms": config.policies.announce_period_ms,
        "lease_keepalive_interval_ms": config.policies.lease_keepalive_interval_ms,
        "lease_expiry_grace_intervals": config.policies.lease_expiry_grace_intervals,
        "next_lease_id": status.next_lease_id,
        "streams": streams,
        "leases": [asdict(lease) for lease in status.leases],
        "counters": {
            "core": dict(sorted(status.counters.items())),
            "agent": dict(sorted(agent_counters.items())),
        },
    }


def write_status(path: str, document: Mapping[str, Any], file_mode: int = 0o644) -> None:
    """Atomically replace the status file (write a temporary file, then rename it)."""
    data = json.dumps(document, separators=(",", ":")).encode("ascii")
    tmp = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(tmp, flags, file_mode)
    try:
        os.fchmod(fd, file_mode)  # exactly the configured mode, whatever the umask (#13.7)
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_status(path: str) -> dict[str, Any]:
    """Load a status document, or raise :class:`StatusUnavailable` saying why not."""
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024 * 1024)
    except FileNotFoundError:
        raise StatusUnavailable(f"no driver status at {path} (has a driver run here?)") from None
    except OSError as exc:
        raise StatusUnavailable(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise StatusUnavailable(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != STATUS_FORMAT:
        raise StatusUnavailable(f"{path} is not a format-{STATUS_FORMAT} driver status document")
    return doc


@dataclass(frozen=True, slots=True)
class Liveness:
    """The reader's verdict: ``running``, ``media_driver_lost``, ``stale`` or ``stopped``, and
    why."""

    verdict: str
    age_ns: int
    reason: str

    @property
    def running(self) -> bool:
        return self.verdict == "running"


def wait_running(path: str, timeout_s: float, *, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll the status file until a live driver reports running (launchers, benchmarks).

    False when `timeout_s` passes or `alive()` (e.g. "the daemon process has not exited")
    turns False first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            if assess(read_status(path), time.time_ns()).running:
                return True
        except StatusUnavailable:
            pass
        time.sleep(0.1)
    return False


def assess(document: Mapping[str, Any], now_unix_ns: int) -> Liveness:
    """Is the driver that wrote ``document`` alive and current?"""
    age = now_unix_ns - int(document.get("written_unix_ns", 0))
    state = str(document.get("state", ""))
    if state == "STOPPED":
        return Liveness("stopped", age, "the driver stopped cleanly")
    pid = int(document.get("pid", 0))
    if not pid_running(pid):
        return Liveness("stale", age, f"driver process {pid} no longer exists")
    if age > int(document.get("stale_after_ns", _MIN_STALE_NS)):
        return Liveness("stale", age, f"status not rewritten for {age / 1e9:.1f} s")
    runtime = document.get("runtime") or {}
    if runtime.get("state") == "media_driver_lost":  # #26.3: alive, but serving nobody
        md = runtime.get("media_driver") or {}
        return Liveness(
            "media_driver_lost",
            age,
            f"media driver in {md.get('dir')} lost {md.get('lost_for_s')} s ago "
            f"({md.get('lost_reason')}); {md.get('reconnect_attempts')} reconnect attempts",
        )
    return Liveness("running", age, "")


def _secs(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e9:.3f}s"


def format_status(document: Mapping[str, Any], liveness: Liveness) -> str:
    """Human-readable status: header, streams table, leases table, counters."""
    lines = [
        f"driver {document.get('instance_id')} pid {document.get('pid')}: "
        f"{document.get('state')} ({liveness.verdict}"
        + (f": {liveness.reason}" if liveness.reason else "")
        + f"; status {liveness.age_ns / 1e9:.1f}s old)",
        f"  config {document.get('config')}",
        f"  aeron dir {document.get('aeron_dir')}; control {document.get('control_channel')} "
        f"stream {document.get('control_stream_id')}; announces "
        f"{document.get('announce_channel')} stream {document.get('announce_stream_id')}",
        f"  keepalive {document.get('lease_keepalive_interval_ms')} ms x "
        f"{document.get('lease_expiry_grace_intervals')}, announce period "
        f"{document.get('announce_period_ms')} ms",
        "",
        "streams:",
    ]
    rows = [("STREAM", "NAME", "PROFILE", "EPOCH", "READY", "PRODUCER", "CONSUMERS", "PENDING")]
    for s in document.get("streams", []):
        producer = (
            "-"
            if s.get("producer_client_id") is None
            else f"client {s['producer_client_id']} lease {s['producer_lease_id']}"
        )
        rows.append(
            (
                str(s.get("stream_id")),
                str(s.get("name")),
                str(s.get("profile")),
                str(s.get("epoch")),
                "yes" if s.get("regions_ready") else "no",
                producer,
                str(s.get("consumer_count")),
                str(s.get("pending_attaches")),
            )
        )
    lines += _table(rows)
    lines += ["", "leases:"]
    rows = [("LEASE", "STREAM", "CLIENT", "ROLE", "STATE", "EPOCH", "AGE", "EXPIRES IN")]
    for lease in document.get("leases", []):
        rows.append(
            (
                str(lease.get("lease_id")),
                str(lease.get("stream_id")),
                str(lease.get("client_id")),
                str(lease.get("role")),
                str(lease.get("state")),
                str(lease.get("epoch")),
                _secs(lease.get("age_ns")),
                _secs(lease.get("expires_in_ns")),
            )
        )
    lines += _table(rows) if len(rows) > 1 else ["  (none)"]
    counters = document.get("counters", {})
    for scope in ("core", "agent"):
        values = counters.get(scope) or {}
        if values:
            text = " ".join(f"{k}={v}" for k, v in values.items())
            lines += ["", f"{scope} counters: {text}"]
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
