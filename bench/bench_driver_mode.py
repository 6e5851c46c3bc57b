"""Frame throughput in driver mode vs standalone mode (issue 4), same run, same process.

A producer and a consumer in one process (so the comparison is the data path, not the
scheduler): standalone (the producer owns its regions) against driver mode (both attach
through a real `tensorpool driver` daemon and use the regions it created). 4 KiB and 64 KiB
frames; both pipelines open at once and measured in short alternating bursts (see
`_measure`); the consumer touches one byte per 4 KiB page.

    .venv/bin/python -m bench.bench_driver_mode [--frames N] [--pairs P] [--verbose]
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


def _open(
    ctx: AeronContext, settings: ClientSettings, driver: bool, stream: int
) -> tuple[Producer, Consumer]:
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
    while not consumer.is_mapped:
        if time.monotonic() > deadline:
            raise SystemExit(f"{'driver' if driver else 'standalone'} consumer never mapped")
        producer.do_work()
        consumer.poll(lambda f: None)
        time.sleep(0.002)
    return producer, consumer


def _burst(producer: Producer, consumer: Consumer, frame: np.ndarray, frames: int) -> float:
    """Seconds of the loop thread's CPU to move ``frames`` frames producer -> consumer."""
    touched = 0

    def handler(f: Frame) -> None:
        nonlocal touched
        touched += int(f.array[::4096].sum())

    got = 0
    cpu0 = time.thread_time()
    while got < frames:
        for _ in range(32):
            producer.offer(frame)
        got += consumer.poll(handler, 64)
        producer.do_work()
    return time.thread_time() - cpu0


def _measure(
    ctx: AeronContext, settings: ClientSettings, size: int, frames: int, pairs: int, stream: int
) -> tuple[list[float], list[float]]:
    """Frames per CPU-second of both modes, in alternating bursts (ABBA order).

    Both pipelines stay open for the whole measurement, so a pair of bursts is milliseconds
    apart and sees the same host state: on this VM the speed of *any* code drifts by ±20 %
    over seconds (a profile shows every function slower by the same factor), which swamped
    the earlier "one mode for N seconds, then the other" design.
    """
    frame = np.zeros(size, np.uint8)
    pipes = {False: _open(ctx, settings, False, stream), True: _open(ctx, settings, True, stream)}
    try:
        for driver in (False, True):  # warm-up: first lap of the ring, caches, code paths
            _burst(*pipes[driver], frame, 2 * frames)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for driver in order:
                rates[driver].append(frames / _burst(*pipes[driver], frame, frames))
        return rates[False], rates[True]
    finally:
        for producer, consumer in pipes.values():
            consumer.close()
            producer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=5000, help="frames per burst")
    ap.add_argument("--pairs", type=int, default=100, help="bursts per mode")
    ap.add_argument("--verbose", action="store_true", help="print every round")
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
            for n, size in enumerate((4096, 65536)):
                sa, dm = _measure(ctx, settings, size, a.frames, a.pairs, 11000 + n)
                if a.verbose:
                    print(f"{size}: standalone {sa}\n{size}: driver {dm}")
                ratios = sorted(d / s for s, d in zip(sa, dm, strict=True))
                q1, q3 = np.percentile(ratios, [25, 75])
                # 95 % bootstrap interval of the median ratio (fixed seed: reproducible text)
                rng = np.random.default_rng(0)
                boot = np.median(rng.choice(ratios, (2000, len(ratios))), axis=1)
                lo, hi = np.percentile(boot, [2.5, 97.5])
                rows.append(
                    (
                        size,
                        float(np.median(sa)),
                        float(np.median(dm)),
                        float(np.median(ratios)),
                        float(q1),
                        float(q3),
                        float(lo),
                        float(hi),
                    )
                )
        print(
            f"`.venv/bin/python -m bench.bench_driver_mode --frames {a.frames} "
            f"--pairs {a.pairs}` — load average {os.getloadavg()[0]:.2f}\n"
        )
        print(
            "| frame | standalone frames/CPU-s (median) | driver mode frames/CPU-s (median) "
            "| driver / standalone (median of paired bursts) | 95 % CI of the median "
            "| interquartile range |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for size, sa_m, dm_m, med, q1, q3, lo, hi in rows:
            print(
                f"| {size // 1024} KiB | {sa_m:,.0f} | {dm_m:,.0f} | {med:.3f} "
                f"| {lo:.3f} – {hi:.3f} | {q1:.3f} – {q3:.3f} |"
            )
    finally:
        daemon.terminate()
        daemon.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
