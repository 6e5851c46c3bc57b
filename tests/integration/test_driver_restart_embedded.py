"""#13.2 and #13.3: every client of the default deployment survives a driver restart.

The default deployment: one `tensorpool driver` daemon hosting the embedded Aeron media driver,
and CLI clients joining that media driver (`produce --driver`, `consume --driver`, the rate
limiter, a bridge sender and receiver in driver mode). When the daemon dies (`kill -9`) or
stops (SIGTERM), its media driver dies with it, and with it every client's Aeron client; a new
daemon on the same config brings a new media driver into the same directory. Each client must
notice, re-create its Aeron client, reattach and carry on at the new epoch by itself.

Every client is a real subprocess; a reader thread per client timestamps its JSON lines, so the
test can measure, per client, the time from the new daemon's start to its first frame at the
new epoch. The times are printed (`-s`), not asserted: the waits are bounded and generous.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from driver_fixtures import DriverProcess, driver_toml, read_status
from netports import free_udp_ports

from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.slow

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
CONTROL = "aeron:ipc?term-length=4m"  # the client commands' default control channel
SOURCE = 10000
BRIDGE_DEST = 10005
RL_DEST = 20050
RL_DESCRIPTORS = 2100
WAIT = 60.0  # bounded wait for a recovery; generous for a loaded 2-core host


class Client:
    """A CLI client in a subprocess: stdout JSON lines timestamped by a reader thread."""

    def __init__(self, name: str, cmd: list[str], log_dir: str) -> None:
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorpool", *cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append((time.monotonic(), json.loads(line)))

    def stderr(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def wait_line(
        self, pred: Callable[[dict[str, Any]], bool], *, after: float = 0.0, timeout: float = WAIT
    ) -> tuple[float, dict[str, Any]]:
        """The first line (reported after monotonic time ``after``) that satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            lines = self.lines
            for t, doc in lines[seen:]:
                if t >= after and pred(doc):
                    return t, doc
            seen = len(lines)
            if self.proc.poll() is not None and seen == len(self.lines):
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.stderr()}"
                )
            if time.monotonic() > deadline:
                tail = [d for _, d in self.lines[-3:]]
                raise AssertionError(
                    f"{self.name}: no matching line within {timeout} s; last {tail}\n"
                    f"{self.stderr()}"
                )
            time.sleep(0.02)

    def stop(self) -> int | None:
        try:
            return stop_process(self.proc, 20)[0]
        finally:
            self._reader.join(5)
            self._log.close()


@pytest.fixture
def work() -> Iterator[dict[str, str]]:
    root = tempfile.mkdtemp(prefix="tp-restart-", dir=SHM_ROOT)
    paths = {
        "root": root,
        "aeron": os.path.join(root, "aeron"),  # created (and served) by the daemon
        "base": os.path.join(root, "shm"),
        "config": os.path.join(root, "driver.toml"),
    }
    text = driver_toml(paths["base"], paths["aeron"], embedded=True)
    Path(paths["config"]).write_text(text.replace('"aeron:ipc?term-length=1m"', f'"{CONTROL}"'))
    yield paths
    shutil.rmtree(root, ignore_errors=True)


def _daemon(work: dict[str, str], name: str) -> tuple[DriverProcess, float]:
    """A new daemon on the same config; returns it with the monotonic time it was started."""
    d = DriverProcess(work["config"], work["base"], os.path.join(work["root"], f"{name}.log"))
    t0 = time.monotonic()
    d.start().wait_ready(2 * WAIT)  # a daemon starts in seconds; a loaded host needs more
    return d, t0


def _common(work: dict[str, str]) -> list[str]:
    return ["--aeron-dir", work["aeron"], "--shm-base-dir", work["base"]]


def _producer(work: dict[str, str], name: str = "producer", *extra: str) -> Client:
    cmd = ["produce", "--driver", "--stream-id", str(SOURCE), "--shape", "16,16", "--dtype",
           "uint8", "--rate", "200", "--json", "--report-interval", "0.1", *extra,
           *_common(work)]  # fmt: skip
    return Client(name, cmd, work["root"])


def _consumer(work: dict[str, str], name: str, stream: int, *extra: str) -> Client:
    cmd = ["consume", "--driver", "--stream-id", str(stream), "--json", "--report-interval",
           "0.1", *extra, *_common(work)]  # fmt: skip
    return Client(name, cmd, work["root"])


def _ratelimiter(work: dict[str, str], name: str = "ratelimiter", *extra: str) -> Client:
    path = os.path.join(work["root"], "rl.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-restart"
descriptor_channel = "aeron:ipc?term-length=4m"
descriptor_stream_id = {RL_DESCRIPTORS}
max_rate_hz = 50

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {RL_DEST}
profile = "small"

[driver]
aeron_dir = "{work["aeron"]}"
control_channel = "{CONTROL}"
config = "{work["config"]}"

[shm]
base_dir = "{work["base"]}"
"""
    )
    cmd = ["ratelimiter", "--config", path, "--json", "--report-interval", "0.2", *extra]
    return Client(name, cmd, work["root"])


def _bridge(work: dict[str, str], role: str, ports: tuple[int, int, int]) -> Client:
    path = os.path.join(work["root"], f"bridge-{role}.toml")
    Path(path).write_text(
        f"""
[bridge]
instance_id = "bridge-{role}"
role = "{role}"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{ports[0]}|term-length=4m"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:{ports[1]}"
control_stream_id = 3001
metadata_channel = "aeron:udp?endpoint=127.0.0.1:{ports[2]}"
metadata_stream_id = 3002
assembly_timeout_ms = 5000

[local]
aeron_dir = "{work["aeron"]}"
driver_mode = true
shm_base_dir = "{work["base"]}"
allowed_base_dirs = ["{work["base"]}"]
announce_period_ms = 200

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {BRIDGE_DEST}
profile = "small"
"""
    )
    return Client(f"bridge-{role}", ["bridge", "--config", path, "--json"], work["root"])


def _flowing(epoch_above: int) -> Callable[[dict[str, Any]], bool]:
    """A progress line at an epoch above ``epoch_above`` that counted frames."""
    return lambda d: (d.get("epoch") or 0) > epoch_above and (d.get("fps") or 0) > 0


def _stop_all(clients: list[Client]) -> None:
    for c in clients:
        c.stop()


def test_13_2_every_client_survives_driver_kill9_and_sigterm(work: dict[str, str]) -> None:
    """#13.2: kill -9, then SIGTERM, of the daemon hosting the embedded media driver, each
    followed by a new daemon on the same config: producer, consumer, rate limiter (seen by a
    consumer of its destination) and bridge (seen by a consumer of its destination) all get
    frames again at a higher epoch, without being restarted."""
    daemon, _ = _daemon(work, "driver-0")
    clients: list[Client] = []
    try:
        producer = _producer(work)
        clients.append(producer)
        producer.wait_line(_flowing(0))
        consumer = _consumer(work, "consumer", SOURCE)
        clients.append(consumer)
        clients.append(_ratelimiter(work))
        rl_out = _consumer(
            work, "rl-consumer", RL_DEST, "--descriptor-stream-id", str(RL_DESCRIPTORS)
        )
        clients.append(rl_out)
        ports = free_udp_ports(3)
        clients.append(_bridge(work, "receiver", ports))
        clients.append(_bridge(work, "sender", ports))
        bridge_out = _consumer(work, "bridge-consumer", BRIDGE_DEST)
        clients.append(bridge_out)
        watched = {"producer": producer, "consumer": consumer, "ratelimiter": rl_out,
                   "bridge": bridge_out}  # fmt: skip
        epochs = {name: c.wait_line(_flowing(0))[1]["epoch"] for name, c in watched.items()}

        times: dict[str, dict[str, float]] = {}
        for n, sig in enumerate((signal.SIGKILL, signal.SIGTERM), start=1):
            for name, c in watched.items():  # the newest epoch each one has reached so far
                epochs[name] = max([epochs[name], *((d.get("epoch") or 0) for _, d in c.lines)])
            daemon.signal(sig)
            daemon.wait(30)
            daemon, t0 = _daemon(work, f"driver-{n}")
            label = signal.Signals(sig).name
            times[label] = {}
            for name, c in watched.items():
                t, doc = c.wait_line(_flowing(epochs[name]), after=t0)
                times[label][name] = round(t - t0, 2)
                epochs[name] = doc["epoch"]
            for c in clients:
                assert c.proc.poll() is None, f"{c.name} exited:\n{c.stderr()}"
        print(f"\n#13.2 recovery (new driver start -> first frame at the new epoch, s): {times}")
    finally:
        _stop_all(clients)
        daemon.stop()


#: #13.3's lease window: keepalives every 0.5 s, expiry after 20 missed (10 s), so a live
#: holder normally keeps its lease on a loaded host (on a starved one it may not: see below)
HANDOVER = {"lease_keepalive_interval_ms": 500, "lease_expiry_grace_intervals": 20}
#: a loaded host (load 20 on 2 cores) needs far longer than a quiet one; only a hang guard
HANDOVER_WAIT = 240.0


def _handover_daemon(work: dict[str, str]) -> DriverProcess:
    text = driver_toml(work["base"], work["aeron"], embedded=True, policies=HANDOVER)
    Path(work["config"]).write_text(text.replace('"aeron:ipc?term-length=1m"', f'"{CONTROL}"'))
    return _daemon(work, "driver")[0]


def _expired_leases(work: dict[str, str]) -> int:
    """The driver core's ``lease_expired`` count as its status file has it now."""
    status = read_status(work["base"])
    assert status is not None, "no driver status file"
    return int(status["counters"]["core"].get("lease_expired", 0))


def _hand_over(
    work: dict[str, str],
    first: Client,
    start_second: Callable[[], Client],
    granted: Callable[[dict[str, Any]], bool],
) -> tuple[Client, dict[str, Any]]:
    """Start a successor while ``first`` holds the lease it wants, kill ``first`` with -9,
    and return the successor with its first ``granted`` line.

    What the rule guarantees, under any timing: the successor gets the stream only after the
    holder's lease expired. Normally the holder is alive and keeps its lease, so the
    successor is refused, says why and retries, and gets the stream after the kill once the
    lease expired. On a starved host the live holder's keepalives can be late past the whole
    window, so its lease expires before the kill and the successor is granted at once; then
    the driver has counted that expiry. Either way ``lease_expired`` has grown by the time
    the successor holds the stream, and a successor that was refused said why."""
    before = _expired_leases(work)
    second = start_second()
    deadline = time.monotonic() + HANDOVER_WAIT
    while "retrying until then" not in second.stderr():
        if any(granted(d) for _, d in second.lines):
            break  # the holder's lease expired while it was alive (checked below)
        assert time.monotonic() < deadline, f"{second.name} neither waited nor got the stream"
        assert second.proc.poll() is None, f"{second.name} exited:\n{second.stderr()}"
        time.sleep(0.05)
    refused = "retrying until then" in second.stderr()
    if refused:
        assert "already has a producer" in second.stderr()
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    line = second.wait_line(granted, timeout=HANDOVER_WAIT)[1]
    while _expired_leases(work) == before:  # the status file is rewritten periodically
        assert time.monotonic() < deadline + HANDOVER_WAIT, "granted, but no lease expired"
        time.sleep(0.1)
    return second, line


def test_13_3_producer_restarted_right_after_kill9_waits_for_the_old_lease(
    work: dict[str, str],
) -> None:
    """#13.3: a driver-mode producer that wants a stream whose producer lease is held waits
    (refused, it says why and retries); when the holder is killed with -9, the stream goes
    to it (higher epoch) once the dead one's lease has expired, and frames flow to a
    consumer.

    #30: the successor is started *before* the kill, so it starts inside the old lease's
    window whatever the host's load. Started after the kill (as before), a successor slower
    to start than the lease found it expired and was never refused, and the test waited 60 s
    for a refusal that could not come; what is asserted now holds under any timing
    (:func:`_hand_over`)."""
    daemon = _handover_daemon(work)
    clients: list[Client] = []
    try:
        first = _producer(work, "producer-1")
        clients.append(first)
        e1 = first.wait_line(_flowing(0), timeout=HANDOVER_WAIT)[1]["epoch"]
        consumer = _consumer(work, "consumer", SOURCE)
        clients.append(consumer)
        consumer.wait_line(_flowing(0), timeout=HANDOVER_WAIT)

        def successor() -> Client:
            clients.append(_producer(work, "producer-2", "--attach-timeout", "600"))
            return clients[-1]

        _, line = _hand_over(work, first, successor, _flowing(e1))
        assert line["epoch"] > e1
        consumer.wait_line(_flowing(e1), timeout=HANDOVER_WAIT)
    finally:
        _stop_all(clients)
        daemon.stop()


def test_13_3_ratelimiter_restarted_right_after_kill9_waits_for_the_old_lease(
    work: dict[str, str],
) -> None:
    """#13.3: the same for a rate limiter: its destination lease outlives the killed process
    for the expiry window; the successor waits it out and its destination flows again (#30:
    started before the kill, as for the producer)."""
    daemon = _handover_daemon(work)
    clients: list[Client] = []
    try:
        clients.append(_producer(work))
        first = _ratelimiter(work, "rl-1")
        clients.append(first)
        out = _consumer(work, "rl-consumer", RL_DEST, "--descriptor-stream-id", str(RL_DESCRIPTORS))
        clients.append(out)
        e1 = out.wait_line(_flowing(0), timeout=HANDOVER_WAIT)[1]["epoch"]

        def successor() -> Client:
            clients.append(_ratelimiter(work, "rl-2", "--attach-timeout", "600"))
            return clients[-1]

        _, started = _hand_over(work, first, successor, lambda d: d.get("event") == "started")
        assert started["mappings"][0]["dest_epoch"] > e1
        out.wait_line(_flowing(e1), timeout=HANDOVER_WAIT)
    finally:
        _stop_all(clients)
        daemon.stop()
