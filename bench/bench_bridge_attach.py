"""A held destination attach vs a healthy stream on the same bridge receiver (issue: the
receiver used to block its duty cycle while a destination attached).

One bridge receiver (in this process, driver mode) with two mappings, a real `tensorpool
driver` and a standalone media driver. Stream A's destination is open and a consumer (its own
thread and Aeron client, like a separate application) reads it. Then the SHM driver is
stopped (SIGSTOP) and stream B's first announce arrives: B's attach goes unanswered for
``--hold`` seconds while a sender thread offers A's frames at ``--rate`` Hz over UDP (a frame
whose chunk cannot be offered is given up, as the bridge sender does: ``back_pressured``).
Then the driver resumes. Counted: A's frames delivered to A's consumer during the hold,
after it, refused by back-pressure, and A's longest delivery gap.

Baseline in the same run: the old rule, reproduced by waiting for the pending attach inside
the receiver's ``_open`` (what ``producer.wait_until_attached()`` did there).

    .venv/bin/python -m bench.bench_bridge_attach [--hold 1.5] [--rate 200]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import free_ports
from tensorpool.bridge.app import BridgeApp
from tensorpool.bridge.chunker import Chunker
from tensorpool.bridge.config import BridgeConfig, parse_bridge_config
from tensorpool.bridge.receiver import BridgeReceiver
from tensorpool.client.consumer import Consumer, Frame
from tensorpool.driver.config import load_driver_config
from tensorpool.driver.status import status_path, wait_running
from tensorpool.shm.layout import SLOT_FIELDS, SLOT_FIELDS_OFFSET, TENSOR_BLOB_OFFSET
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess

SRC_A, SRC_B, DEST_A, DEST_B = 10100, 10101, 20100, 20101
CHUNK = 1280

DRIVER = """\
[driver]
instance_id = "bench-attach"
aeron_dir = "{aeron}"
embedded_media_driver = false
[shm]
base_dir = "{shm}"
permissions_mode = "600"
allowed_base_dirs = ["{shm}"]
[policies]
lease_keepalive_interval_ms = 500
lease_expiry_grace_intervals = 4
[profiles.p]
header_nslots = 256
payload_pools = [{{ pool_id = 1, stride_bytes = 4096 }}]
[streams.a]
stream_id = {a}
profile = "p"
[streams.b]
stream_id = {b}
profile = "p"
"""


def _bridge_config(aeron: str, shm: str, hold_s: float) -> BridgeConfig:
    p = free_ports(2, udp=True)
    return parse_bridge_config(
        {
            "bridge": {
                "instance_id": "rx-bench",
                "role": "receiver",
                "payload_channel": f"aeron:udp?endpoint=127.0.0.1:{p[0]}",
                "payload_stream_id": 3000,
                "control_channel": f"aeron:udp?endpoint=127.0.0.1:{p[1]}",
                "control_stream_id": 3001,
            },
            "local": {
                "aeron_dir": aeron,
                "driver_mode": True,
                "shm_base_dir": shm,
                "allowed_base_dirs": [shm],
                "announce_period_ms": 10_000,  # freshness outlasts the driver's stop
                "attach_timeout_ms": int(hold_s * 1000) + 5000,  # B stays pending all the hold
            },
            "profiles": {
                "p": {"header_nslots": 256, "payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}
            },
            "mappings": [
                {"source_stream_id": SRC_A, "dest_stream_id": DEST_A, "profile": "p"},
                {"source_stream_id": SRC_B, "dest_stream_id": DEST_B, "profile": "p"},
            ],
        },
        env={},
    )


def _announce(src: int) -> bytes:
    buf = bytearray(1024)
    n = wire.ShmPoolAnnounceEncoder.encode(
        buf, 0, stream_id=src, producer_id=9, epoch=1,
        announce_timestamp_ns=time.monotonic_ns(), announce_clock_domain=1, layout_version=1,
        header_nslots=256, header_slot_bytes=256,
        payload_pools=[(1, 256, 4096, "shm:file?path=/nonexistent")],
        header_region_uri="shm:file?path=/nonexistent",
    )  # fmt: skip
    return bytes(buf[:n])


def _chunks(src: int, seq: int) -> list[bytes]:
    arr = np.arange(900, dtype="<i4") + seq  # 3600 bytes: 3 chunks
    hdr = bytearray(256)
    struct.pack_into("<Q", hdr, 0, (seq << 1) | 1)
    SLOT_FIELDS.pack_into(hdr, SLOT_FIELDS_OFFSET, arr.nbytes, seq & 255, 1, 0, seq + 1, 0)
    hdr[TENSOR_BLOB_OFFSET:] = TensorLayout.from_array(arr).blob
    return Chunker(CHUNK).encode_frame(
        stream_id=src, epoch=1, seq=seq, header=bytes(hdr), payload=arr.tobytes()
    )


def _instrument(rx: BridgeReceiver, blocking: bool, spent: list[float]) -> None:
    """Time each destination open inside the duty cycle; ``blocking`` restores the old rule
    (the receiver waits there for the driver's answer)."""
    opener = rx._open

    def _open(dest: Any, source_epoch: int) -> None:
        t0 = time.perf_counter()
        opener(dest, source_epoch)
        while blocking and dest.pending is not None:
            rx._drive_attach(dest, rx._clock())
            time.sleep(0.001)
        spent.append(time.perf_counter() - t0)

    rx._open = _open  # type: ignore[method-assign]


def _run(md: MediaDriverProcess, work: Path, blocking: bool, hold_s: float, rate: int) -> dict:
    shm = work / "shm"
    cfg_path = work / "driver.toml"
    cfg_path.write_text(DRIVER.format(aeron=md.dir, shm=shm, a=DEST_A, b=DEST_B))
    log = open(work / "driver.log", "ab")  # noqa: SIM115 - handed to the child
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "driver", "--config", str(cfg_path)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    transport = TransportConfig(aeron_dir=md.dir)
    ctx = AeronContext(transport).start()
    app: BridgeApp | None = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    arrivals: list[float] = []
    sent = refused = 0
    t_hold = t_cont = 0.0
    try:
        if not wait_running(
            status_path(load_driver_config(str(cfg_path))), 30, alive=lambda: daemon.poll() is None
        ):
            raise SystemExit("driver did not start")
        cfg = _bridge_config(md.dir, str(shm), hold_s)
        app = BridgeApp(cfg, ctx=ctx)
        assert app.receiver is not None
        opens: list[float] = []
        _instrument(app.receiver, blocking, opens)
        b = cfg.bridge
        control = ctx.add_publication(b.control_channel, b.control_stream_id)
        settings = cfg.local.client_settings()
        local_epoch = 0
        consumer_epoch: list[int | None] = [None]

        def consume() -> None:
            with AeronContext(transport) as cctx:
                consumer = Consumer(cctx, DEST_A, settings, driver=True)

                def take(f: Frame) -> None:
                    if f.is_current():
                        arrivals.append(time.monotonic())

                while not stop.is_set():
                    consumer.poll(take)
                    consumer_epoch[0] = consumer.epoch
                    time.sleep(0.0002)
                consumer.close()

        threads.append(threading.Thread(target=consume, daemon=True))
        threads[0].start()

        def rows() -> dict[int, dict[str, Any]]:
            assert app is not None
            return {r["source_stream_id"]: r for r in app.status()}

        def pump(until: Any, timeout: float = 30.0) -> None:
            deadline = time.monotonic() + timeout
            while not until():
                assert app is not None
                app.do_work()
                if time.monotonic() > deadline:
                    raise SystemExit(f"timed out: {rows()}")
                time.sleep(0.0002)

        while not control.offer(_announce(SRC_A)):
            app.do_work()
        pump(lambda: rows()[SRC_A]["destination"] == "open")
        local_epoch = rows()[SRC_A]["local_epoch"]
        pump(lambda: consumer_epoch[0] == local_epoch)

        def send() -> None:
            nonlocal sent, refused, t_hold, t_cont
            with AeronContext(transport) as sctx:
                pub = sctx.add_publication(b.payload_channel, b.payload_stream_id)
                while not pub.is_connected:
                    time.sleep(0.001)
                ready.set()
                go.wait()
                period = 1.0 / rate
                t_hold = time.monotonic()
                seq = 0
                while time.monotonic() - t_hold < hold_s:
                    seq += 1
                    ok = all(pub.offer(m) for m in _chunks(SRC_A, seq))
                    sent += ok
                    refused += not ok
                    time.sleep(max(0.0, t_hold + seq * period - time.monotonic()))
                t_cont = time.monotonic()
                os.kill(daemon.pid, signal.SIGCONT)  # the driver answers B's attach now

        ready, go = threading.Event(), threading.Event()
        threads.append(threading.Thread(target=send, daemon=True))
        threads[1].start()
        pump(ready.is_set)
        published0 = rows()[SRC_A]["frames"]
        del opens[:]
        os.kill(daemon.pid, signal.SIGSTOP)
        while not control.offer(_announce(SRC_B)):
            app.do_work()
        go.set()
        pump(lambda: not threads[1].is_alive() and rows()[SRC_B]["destination"] == "open")
        n = sent
        pump(lambda: len(arrivals) >= n or time.monotonic() > t_cont + 2, 10)
        during = [t for t in arrivals if t_hold <= t < t_cont]
        inside = [t_hold, *during, t_cont]
        gap = max(b - a for a, b in itertools.pairwise(inside))
        return {
            "sent": sent,
            "refused": refused,
            "during": len(during),
            "after": len([t for t in arrivals if t >= t_cont]),
            "gap": gap,
            "open": max(opens, default=0.0),
            "published": rows()[SRC_A]["frames"] - published0,
            "b_failures": rows()[SRC_B]["open_failures"],
        }
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        with_daemon = daemon.poll() is None
        if with_daemon:
            os.kill(daemon.pid, signal.SIGCONT)
        if app is not None:
            app.close()
        ctx.close()
        daemon.terminate()
        daemon.wait(20)
        shutil.rmtree(shm, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # below the driver client's 2 s attach request timeout: a longer stop makes it re-send the
    # attach, and the resumed driver refuses B until the first grant's orphan lease expires
    ap.add_argument("--hold", type=float, default=1.5, help="seconds B's attach is held")
    ap.add_argument("--rate", type=int, default=200, help="A's frames per second")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tp-bench-attach-", dir="/dev/shm"))
    results = []
    try:
        with MediaDriverProcess() as md:
            for blocking in (True, False):
                run = work / ("blocking" if blocking else "nonblocking")
                run.mkdir()
                results.append((blocking, _run(md, run, blocking, a.hold, a.rate)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"`.venv/bin/python -m bench.bench_bridge_attach --hold {a.hold:g} --rate {a.rate}` "
        f"— load average {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| receiver | A frames offered | refused (back-pressure) | published by the receiver "
        "| consumer got during the hold | after it | A's longest gap during the hold "
        "| B's open inside one duty cycle | B open failures |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for blocking, r in results:
        name = "blocking attach (before)" if blocking else "non-blocking attach (after)"
        print(
            f"| {name} | {r['sent'] + r['refused']} | {r['refused']} | {r['published']} "
            f"| {r['during']} "
            f"| {r['after']} | {r['gap']:.2f} s | {r['open'] * 1000:.0f} ms | {r['b_failures']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
