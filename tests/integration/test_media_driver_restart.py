"""#26.1, #26.2, #26.4: daemons on an *external* media driver survive its ``kill -9`` and a new
one on the same directory, without being restarted themselves.

The operator's setup from docs/operator.md: ``tensorpool mediadriver --aeron-dir D`` first, then the
SHM driver with ``embedded_media_driver = false`` and clients joining D. Before #26 the SHM
driver never called ``AeronContext.maintain()``: after the restart its control subscription
and publications stayed bound to the dead media driver, and driver-mode clients got no lease
(and no frames) ever again while ``driver status`` said RUNNING.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
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
    from netports import free_port

    from tensorpool.observe.metrics import scrape_values

    port = free_port()

    def connected() -> float | None:  # the driver's tensorpool_media_driver_connected gauge
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                values = scrape_values(r.read().decode())
        except OSError:
            return None
        hits = [v for k, v in values.items() if k.startswith("tensorpool_media_driver_connected")]
        return hits[0] if hits else None

    try:
        daemon.start("--metrics-bind", str(port)).wait_ready()
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
        doc = json.loads(lost["out"])
        md_health = doc["runtime"]["media_driver"]
        assert md_health["connected"] is False and md_health["lost_for_s"] >= 0
        assert doc["liveness"]["verdict"] == "media_driver_lost"
        assert connected() == 0.0  # the Prometheus gauge says so too
        # the driver-mode client's report says its media driver is lost
        wait_for(
            lambda: consumer.lines()[-1].get("media_driver_connected") is False, 30, consumer.text
        )
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
        assert connected() == 1.0
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


def _rl_toml(work: str, aeron_dir: str, base: str) -> str:
    path = os.path.join(work, "rl.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-mdr"
descriptor_channel = "aeron:ipc?term-length=1m"
descriptor_stream_id = 2100
max_rate_hz = 20

[[mappings]]
source_stream_id = {SRC}
dest_stream_id = {RL_DEST}
profile = "small"

[driver]
aeron_dir = "{aeron_dir}"
control_channel = "{CONTROL_CHANNEL}"
config = "{os.path.join(work, "driver.toml")}"

[shm]
base_dir = "{base}"
"""
    )
    return path


def _bridge_toml(work: str, aeron_dir: str, base: str, role: str, ports: list[int]) -> str:
    path = os.path.join(work, f"bridge-{role}.toml")
    p_payload, p_control, p_meta = ports
    Path(path).write_text(
        f"""
[bridge]
instance_id = "bridge-{role}"
role = "{role}"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{p_payload}"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:{p_control}"
control_stream_id = 3001
metadata_channel = "aeron:udp?endpoint=127.0.0.1:{p_meta}"
metadata_stream_id = 3002
assembly_timeout_ms = 5000

[local]
aeron_dir = "{aeron_dir}"
driver_mode = true
shm_base_dir = "{base}"
allowed_base_dirs = ["{base}"]
announce_period_ms = 200

[[mappings]]
source_stream_id = {SRC}
dest_stream_id = {BRIDGE_DEST}
profile = "small"
source_control_stream_id = 1201
dest_control_stream_id = 2201
"""
    )
    return path


SRC, RL_DEST, BRIDGE_DEST = 10000, 10001, 10002


def test_26_2_every_daemon_survives_external_media_driver_kill9_and_restart(work: str) -> None:
    """#26.2 for the daemons besides the SHM driver, all at once on one external media driver:
    ``produce --driver``, ``consume --driver``, the rate limiter (source -> its destination's
    consumer), both ends of a bridge (sender and receiver processes, UDP on loopback, into a
    local destination's consumer) and ``serve --driver`` (a Flight client sees the stream live).
    After kill -9 of the media driver and a new one 2 s later, each client gets new frames
    without any daemon being restarted. Prints the recovery time of each (new media driver
    start -> first new frame at that client) for docs/operator.md."""
    from netports import free_port, free_udp_ports

    from tensorpool.spark_source.options import FlightAccess
    from tensorpool.spark_source.rings import remote

    aeron_dir = os.path.join(work, "aeron")
    base = os.path.join(work, "shm")
    Path(work, "driver.toml").write_text(
        driver_toml(
            base,
            aeron_dir,
            # leases that outlive a loaded 2-core host's stalls with nine processes on it
            policies={"lease_keepalive_interval_ms": 500, "lease_expiry_grace_intervals": 10},
        )
    )
    started: list[Cli] = [start_media_driver(work, aeron_dir, "md1")]
    daemon = DriverProcess(
        os.path.join(work, "driver.toml"), base, os.path.join(work, "driver.log")
    )
    shm = ["--aeron-dir", aeron_dir, "--shm-base-dir", base, "--driver"]
    report = ["--json", "--report-interval", "0.2"]
    port = free_port()
    access = FlightAccess(retry_s=0)

    def served() -> tuple[int, int] | None:
        """(epoch, head) of the stream while ``serve`` says it is live."""
        try:
            snap = remote.scan_host(f"127.0.0.1:{port}", [SRC], access)[SRC]
        except Exception:  # the server answers, or it is not there yet
            return None
        return None if snap is None or not snap.live else (snap.spec.epoch, snap.state.head)

    try:
        daemon.start().wait_ready()

        def start(name: str, *args: str) -> Cli:
            proc = Cli(work, name, *args)
            started.append(proc)
            return proc

        start(
            "produce", "produce", *shm, "--stream-id", str(SRC), "--rate", "100", "--shape", "64",
            *report,
        )  # fmt: skip
        rl = start("rl", "ratelimiter", "--config", _rl_toml(work, aeron_dir, base), "--json")
        ports = free_udp_ports(3)
        rx = start(
            "rx", "bridge", "--config", _bridge_toml(work, aeron_dir, base, "receiver", ports)
        )
        tx = start("tx", "bridge", "--config", _bridge_toml(work, aeron_dir, base, "sender", ports))
        start("serve", "serve", *shm, "--stream-id", str(SRC), "--port", str(port))
        clients = {
            "consume --driver": start("c-src", "consume", *shm, "--stream-id", str(SRC), *report),
            "ratelimiter": start(
                "c-rl",
                "consume",
                *shm,
                "--stream-id",
                str(RL_DEST),
                *report,
                "--descriptor-stream-id",
                "2100",
            ),
            "bridge": start("c-br", "consume", *shm, "--stream-id", str(BRIDGE_DEST), *report),
        }

        def everyone() -> str:
            return "\n".join(f"== {c.out}\n{c.text()}" for c in started) + daemon.log_text()[-2000:]

        for proc in clients.values():
            wait_for(lambda p=proc: frames(p) >= 5, 90, everyone)
        wait_for(lambda: served() is not None, 60, everyone)

        started[0].kill9()
        time.sleep(2)
        before = {name: frames(proc) for name, proc in clients.items()}
        head = served() or (0, 0)
        t0 = time.monotonic()
        started.append(start_media_driver(work, aeron_dir, "md2"))
        recovered: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while len(recovered) < len(clients) + 1 and time.monotonic() < deadline:
            for name, proc in clients.items():
                if name not in recovered and frames(proc) > before[name] + 2:
                    recovered[name] = time.monotonic() - t0
            now = served()  # live again, with frames past those before the kill
            if (
                "serve --driver" not in recovered
                and now is not None
                and (now[0] != head[0] or now[1] > head[1] + 2)
            ):
                recovered["serve --driver"] = time.monotonic() - t0
            time.sleep(0.05)
        print("recovery (new media driver start -> first new frame at the client):", recovered)
        assert len(recovered) == len(clients) + 1, (recovered, everyone())
        for proc in (rl, rx, tx):  # none was restarted
            assert proc.proc.poll() is None, proc.text()
    finally:
        for proc in reversed(started):
            proc.stop()
        daemon.stop()
