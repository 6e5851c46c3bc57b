"""Frame throughput in driver mode vs standalone mode (issue 4), same run, same process.

A producer and a consumer in one process (so the comparison is the data path, not the
scheduler): standalone (the producer owns its regions) against driver mode (both attach
through a real `tensorpool driver` daemon and use the regions it created). 4 KiB and 64 KiB
frames, rounds alternated; the consumer touches one byte per 4 KiB page.

    .venv/bin/python -m bench.bench_driver_mode [--seconds S] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.driver.config import load_driver_config
from tensorpool.driver.status import status_path, wait_running
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

TOML = """\
[driver]
instance_id = "bench"
aeron_dir = "{aeron}"
embedded_media_driver = true
[shm]
base_dir = "{shm}"
permissions_mode = "600"
allowed_base_dirs = ["{shm}"]
[profiles.p]
header_nslots = 1024
payload_pools = [{{ pool_id = 1, stride_bytes = 4096 }}, {{ pool_id = 2, stride_bytes = 65536 }}]
[streams.a]
stream_id = 10000
profile = "p"
"""


def _run(
    ctx: AeronContext,
    settings: ClientSettings,
    driver: bool,
    size: int,
    seconds: float,
    stream: int,
) -> float:
    if driver:
        producer = Producer(ctx, 10000, settings, driver=True)
        consumer = Consumer(ctx, 10000, settings, driver=True)
    else:
        cfg = StreamConfig(
            stream, header_nslots=1024, pools=(PoolConfig(1, 4096), PoolConfig(2, 65536))
        )
        producer = Producer(ctx, cfg, settings)
        consumer = Consumer(ctx, stream, settings)
    deadline = time.monotonic() + 10
    while not consumer.is_mapped and time.monotonic() < deadline:
        producer.do_work()
        consumer.poll(lambda f: None)
        time.sleep(0.002)
    frame = np.zeros(size, np.uint8)
    touched = 0

    def handler(f: Frame) -> None:
        nonlocal touched
        touched += int(f.array[::4096].sum())

    got = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        for _ in range(32):
            producer.offer(frame)
        got += consumer.poll(handler, 64)
        producer.do_work()
    elapsed = time.perf_counter() - start
    consumer.close()
    producer.close()
    return got / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tp-bench-dm-", dir="/dev/shm"))
    aeron, shm = work / "aeron", work / "shm"
    (work / "driver.toml").write_text(TOML.format(aeron=aeron, shm=shm))
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorpool",
            "driver",
            "--config",
            str(work / "driver.toml"),
            "--log-level",
            "warning",
        ]
    )
    try:
        path = status_path(load_driver_config(str(work / "driver.toml")))
        if not wait_running(path, 30, alive=lambda: daemon.poll() is None):
            raise SystemExit("driver did not start")
        settings = ClientSettings(
            transport=TransportConfig(aeron_dir=str(aeron)), shm_base_dir=str(shm)
        )
        rows = []
        with AeronContext(settings.transport) as ctx:
            stream = 11000
            for size in (4096, 65536):
                results: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(a.rounds):
                    for driver in (False, True):
                        stream += 1
                        results[driver].append(_run(ctx, settings, driver, size, a.seconds, stream))
                sa = float(np.median(results[False]))
                dm = float(np.median(results[True]))
                rows.append((size, sa, dm))
        print(
            f"`.venv/bin/python -m bench.bench_driver_mode --seconds {a.seconds:g} "
            f"--rounds {a.rounds}` — load average {os.getloadavg()[0]:.2f}\n"
        )
        print("| frame | standalone frames/s | driver mode frames/s | driver / standalone |")
        print("| --- | ---: | ---: | ---: |")
        for size, sa, dm in rows:
            print(f"| {size // 1024} KiB | {sa:,.0f} | {dm:,.0f} | {dm / sa:.3f} |")
    finally:
        daemon.terminate()
        daemon.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
