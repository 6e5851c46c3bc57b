"""#19.1 Prometheus metrics: every daemon and client command scraped over HTTP while frames flow.

Real processes on one standalone media driver: `tensorpool driver` (metrics_bind from its config
file), `produce --driver` and `consume --driver` (``--metrics-bind``), a rate limiter
(``rate_limiter.metrics_bind``) and a bridge in role ``both`` over UDP loopback
(``--metrics-bind``), and `tensorpool serve --driver` (``--metrics-bind``). Each endpoint is
scraped twice; the counters that must move do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from driver_fixtures import DriverProcess, driver_toml
from netports import free_ports

from tensorpool.observe.metrics import scrape_values
from tensorpool.spark_source.options import FlightAccess
from tensorpool.spark_source.rings import remote
from tensorpool.transport.process import stop_process

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
CONTROL = "aeron:ipc?term-length=1m"
SOURCE = 10001
RL_DEST = 10004
BRIDGE_SRC = 10001
BRIDGE_DEST = 10006
POLICIES = {"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 60}


DOCS = Path(__file__).resolve().parents[2] / "docs"
#: every exposition scraped in this module, for the check that the docs name real metrics
SEEN: list[str] = []


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    SEEN.append(text)
    return scrape_values(text)


def exposed_names(texts: list[str]) -> set[str]:
    """Family names (``# TYPE`` lines, so families without samples count) and sample names."""
    names: set[str] = set()
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def wait_scrape(
    port: int, ok: Callable[[dict[str, float]], bool], what: str, timeout: float = 60
) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    last: dict[str, float] | str = "no answer"
    while time.monotonic() < deadline:
        try:
            last = scrape(port)
            if ok(last):
                return last
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise AssertionError(f"{what}: {last}")


def tp(*args: str, log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tensorpool", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=f,
        )


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-observe-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_metrics_every_process_moves(media_driver, work: str) -> None:
    base = os.path.join(work, "shm")
    md = media_driver.dir
    p_drv, p_prod, p_cons, p_rl, p_br, p_srv, p_flight = free_ports(7)
    udp = free_ports(3, socket.SOCK_DGRAM)
    cfg = os.path.join(work, "driver.toml")
    text = driver_toml(base, md, policies=POLICIES)
    Path(cfg).write_text(text.replace("[driver]\n", f'[driver]\nmetrics_bind = "{p_drv}"\n', 1))
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start().wait_ready()
    client = ["--driver", "--aeron-dir", md, "--shm-base-dir", base, "--control-channel", CONTROL]
    rl_cfg = os.path.join(work, "rl.toml")
    Path(rl_cfg).write_text(f"""
[rate_limiter]
instance_id = "rl-observe"
descriptor_channel = "aeron:ipc?term-length=4m"
descriptor_stream_id = 2150
max_rate_hz = 20
metrics_bind = "127.0.0.1:{p_rl}"

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {RL_DEST}
profile = "small"

[driver]
aeron_dir = "{md}"
control_channel = "{CONTROL}"
config = "{cfg}"

[shm]
base_dir = "{base}"
""")
    br_cfg = os.path.join(work, "bridge.toml")
    Path(br_cfg).write_text(f"""
[bridge]
instance_id = "bridge-observe"
role = "both"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{udp[0]}|term-length=4m"
payload_stream_id = 3100
control_channel = "aeron:udp?endpoint=127.0.0.1:{udp[1]}"
control_stream_id = 3101
forward_metadata = false
assembly_timeout_ms = 5000

[local]
aeron_dir = "{md}"
driver_mode = true
control_channel = "{CONTROL}"
shm_base_dir = "{base}"
allowed_base_dirs = ["{base}"]

[[mappings]]
source_stream_id = {BRIDGE_SRC}
dest_stream_id = {BRIDGE_DEST}
profile = "small"
""")
    procs: list[subprocess.Popen[bytes]] = []
    names = ("produce", "consume", "rl", "bridge", "serve")
    logs = {n: os.path.join(work, f"{n}.log") for n in names}
    try:
        procs.append(
            tp("produce", *client, "--stream-id", str(SOURCE), "--shape", "32,32", "--rate",
               "200", "--quiet", "--metrics-bind", f"127.0.0.1:{p_prod}", log=logs["produce"])
        )  # fmt: skip
        procs.append(
            tp("consume", *client, "--stream-id", str(SOURCE), "--report-interval", "60",
               "--metrics-bind", str(p_cons), log=logs["consume"])
        )  # fmt: skip
        procs.append(
            tp("ratelimiter", "--config", rl_cfg, "--report-interval", "0", log=logs["rl"])
        )
        procs.append(
            tp("bridge", "--config", br_cfg, "--report-interval", "0", "--metrics-bind",
               f"127.0.0.1:{p_br}", log=logs["bridge"])
        )  # fmt: skip
        procs.append(
            tp("serve", *client, "--stream-id", str(SOURCE), "--port", str(p_flight),
               "--metrics-bind", str(p_srv), log=logs["serve"])
        )  # fmt: skip
        s = f'stream="{SOURCE}"'
        published = f"tensorpool_frames_published_total{{{s}}}"
        accepted = f"tensorpool_frames_accepted_total{{{s}}}"
        rl_pub = (
            f'tensorpool_ratelimiter_frames_published_total{{dest_stream="{RL_DEST}",'
            f'source_stream="{SOURCE}"}}'
        )
        mapping = f"{BRIDGE_SRC}->{BRIDGE_DEST}"
        rx = f'tensorpool_bridge_frames_total{{mapping="{mapping}",role="receiver"}}'
        tx = rx.replace("receiver", "sender")
        try:
            a_prod = wait_scrape(p_prod, lambda m: m.get(published, 0) > 0, "producer")
            a_cons = wait_scrape(p_cons, lambda m: m.get(accepted, 0) > 0, "consumer")
            a_rl = wait_scrape(p_rl, lambda m: m.get(rl_pub, 0) > 0, "rate limiter")
            a_br = wait_scrape(p_br, lambda m: m.get(rx, 0) > 0, "bridge")
            a_drv = wait_scrape(
                p_drv,
                lambda m: m.get('tensorpool_driver_leases{role="consumer",state="active"}', 0) >= 4,
                "driver: consumer leases of consume, rate limiter, bridge and serve",
            )
            scans = 'tensorpool_serve_events_total{event="scans"}'
            a_srv = wait_scrape(p_srv, lambda m: "tensorpool_serve_frames_total" in m, "serve")
            for _ in range(3):  # Flight "scan" actions: the serve counters must move
                remote.scan_host(f"127.0.0.1:{p_flight}", [SOURCE], FlightAccess())
        except AssertionError:
            for name, path in logs.items():
                print(name, Path(path).read_text(errors="replace")[-2000:])
            raise
        # #19.2 with a driver: rings under <instance>/stream-<id>/epoch-*, the producers found
        # by their writable mappings, the rate limiter's frames counted in its ring
        top = subprocess.run(
            [sys.executable, "-m", "tensorpool", "top", "--shm-base-dir", base, "--aeron-dir",
             md, "--control-channel", CONTROL, "--control-stream-id", "1000", "--once",
             "--json", "--report-interval", "1.5"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        b_prod, b_cons, b_rl, b_br, b_drv, b_srv = map(
            scrape, (p_prod, p_cons, p_rl, p_br, p_drv, p_srv)
        )
    finally:
        for p in reversed(procs):
            stop_process(p, 20)
        daemon.stop()
    # producer: frames and bytes move; epoch and the client-side attach histogram are there
    assert b_prod[published] > a_prod[published]
    bytes_pub = f"tensorpool_bytes_published_total{{{s}}}"
    assert b_prod[bytes_pub] - a_prod[bytes_pub] >= 2048 * (b_prod[published] - a_prod[published])
    assert b_prod[f'tensorpool_epoch{{role="producer",{s}}}'] >= 1
    assert b_prod["tensorpool_attach_latency_seconds_count"] == 1
    # consumer: frames accepted move; the drop family carries the reason names; announces seen
    assert b_cons[accepted] > a_cons[accepted]
    assert f'tensorpool_frames_dropped_total{{reason="gap",{s}}}' in b_cons
    assert 0 <= b_cons[f"tensorpool_announce_age_seconds{{{s}}}"] < 5
    # rate limiter: published moves, the rate gate's drops are counted as "superseded"
    assert b_rl[rl_pub] > a_rl[rl_pub]
    sup = (
        f'tensorpool_ratelimiter_frames_dropped_total{{dest_stream="{RL_DEST}",'
        f'reason="superseded",source_stream="{SOURCE}"}}'
    )
    assert b_rl[sup] > b_rl[rl_pub], "200 Hz into 20 Hz: most frames superseded"
    # bridge: frames and chunks move on both sides
    assert b_br[rx] > a_br[rx] and b_br[tx] > a_br[tx]
    chunks = rx.replace("frames_total", "chunks_total")
    assert b_br[chunks] >= b_br[rx]
    # driver: leases by role and state, epochs, the attach histogram, events
    assert b_drv['tensorpool_driver_leases{role="producer",state="active"}'] >= 3
    assert b_drv[f"tensorpool_driver_epoch{{{s}}}"] >= 1
    assert b_drv["tensorpool_driver_attach_latency_seconds_count"] >= 6
    assert (
        b_drv['tensorpool_driver_events_total{event="announces",source="core"}']
        > a_drv['tensorpool_driver_events_total{event="announces",source="core"}']
    )
    # top: the driver's view and the host's, side by side
    doc = json.loads(top.stdout)
    assert doc["driver"]["state"] == "RUNNING"
    rows = {r["stream_id"]: r for r in doc["streams"]}
    src, dst = rows[SOURCE], rows[RL_DEST]
    assert src["producer_command"] == "produce" and dst["producer_command"] == "ratelimiter"
    assert 0 < src["frames_per_s"] < 300, "produce --rate 200 (slower on a loaded host)"
    assert 0 < dst["frames_per_s"] < 30, "the rate limiter's 20 Hz, not its source's seq rate"
    # consumers: consume, rate limiter, bridge, serve; and the producer's lease
    assert src["consumers"] == 4 and src["leases"] == 5
    assert src["local_readers"] >= 3 and len(src["qos_consumers"]) >= 2
    assert src["announce_age_s"] is not None and src["announce_age_s"] < 2
    # serve (Arrow Flight): its calls are counted
    assert b_srv[scans] >= a_srv.get(scans, 0) + 3
    # the docs (metrics table, Grafana dashboard) name only metrics that exist
    names = exposed_names(SEEN)
    for doc in ("observe.md", "grafana-tensorpool.json"):
        text = (DOCS / doc).read_text()
        named = set(re.findall(r"\b(?:tensorpool|process)_[a-z_]+[a-z]", text))
        named = {re.sub(r"_bucket$", "", n) for n in named}
        missing = sorted(n for n in named if n not in names)
        assert not missing, f"docs/{doc} names metrics nobody exposes: {missing}"
    # process CPU and RSS in every process
    for m in (b_prod, b_cons, b_rl, b_br, b_drv, b_srv):
        assert m["process_resident_memory_bytes"] > 1e6
        assert m["process_cpu_seconds_total"] > 0
