"""#19 observability costs, in one run: metrics on vs off, and the viewer and `top` at 30 Hz.

1. `produce --rate 0` and `consume` flat out at 4 KiB and 640 KiB frames, alternately without
   and with `--metrics-bind` on both (scraped every 0.5 s meanwhile, 30x Prometheus' usual
   rate): producer frames/s and consumer frames/s, median of the repeats.
2. A 640x480 uint16 camera at 100 Hz; `tensorpool view` with a client fetching `/frame` at
   30 Hz, then `tensorpool top --report-interval 0.033`: each one's CPU (utime+stime over wall time,
   from /proc), and the producer's CPU with and without them.

    python -m bench observe [-- --seconds 4 --repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


def _scraper(ports: list[int], stop: threading.Event) -> None:
    while not stop.wait(0.5):
        for p in ports:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=2).read()


def _wait_cpu(proc: subprocess.Popen, timeout: float) -> float:
    """Wait for a child; its CPU seconds (user + system) from wait4's rusage.

    Never ``proc.poll()`` here: it would reap the child and lose the rusage.
    """
    deadline = time.monotonic() + timeout
    while True:
        pid, _, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = 0
            return ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            os.kill(proc.pid, 9)
        time.sleep(0.05)


def throughput(dirs: list[str], shape: str, seconds: float, metrics: bool, sid: int, tmp: str):
    """(producer frames/s, consumer frames/s, producer frames per CPU-second)."""
    mp, mc = 19300 + sid % 100, 19400 + sid % 100
    extra_p = ["--metrics-bind", str(mp)] if metrics else []
    extra_c = ["--metrics-bind", str(mc)] if metrics else []
    c_out, p_err = os.path.join(tmp, f"c{sid}.out"), os.path.join(tmp, f"p{sid}.err")
    with open(c_out, "w") as co:
        cons = subprocess.Popen(
            _tp("consume", *dirs, "--stream-id", str(sid), "--duration", str(seconds + 1.5),
                "--json", "--report-interval", "100", *extra_c),
            stdout=co,
        )  # fmt: skip
    time.sleep(1.0)
    with open(p_err, "w") as pe:
        prod = subprocess.Popen(
            _tp("produce", *dirs, "--stream-id", str(sid), "--shape", shape, "--dtype", "uint8",
                "--rate", "0", "--pattern", "stamp", "--duration", str(seconds), "--json",
                "--report-interval", "100", *extra_p),
            stdout=subprocess.DEVNULL, stderr=pe,
        )  # fmt: skip
    stop = threading.Event()
    t = threading.Thread(target=_scraper, args=([mp, mc] if metrics else [], stop))
    t.start()
    p_cpu = _wait_cpu(prod, seconds + 60)
    _wait_cpu(cons, seconds + 60)
    stop.set()
    t.join()
    with open(p_err) as f:
        produced = int(f.read().strip().split()[1])  # "produced N frames on stream ..."
    with open(c_out) as f:
        final = json.loads(f.read().strip().splitlines()[-1])
    return produced / seconds, final["frames"] / seconds, produced / p_cpu


def paired_ab(md_dir: str, base: str, nbytes: int, windows: int, window_s: float) -> tuple:
    """One process, one producer and one consumer of ``nbytes`` frames in one loop (claim,
    commit, poll; the consumer touches a byte per page), in alternating windows with the
    metrics server running and scraped at 2 Hz (on) and not existing at all (off).

    Returns the medians of the paired on/off ratios of frames/s and of frames per CPU-second
    (the process's CPU, the scrape thread's included), the CPU ratio's range, and the median
    frames/s off and on.
    Pairs cancel the host's load drift, which dwarfs any metrics cost on a shared machine.
    """
    import numpy as np

    from tensorpool.client.consumer import Consumer
    from tensorpool.client.producer import Producer, StreamConfig
    from tensorpool.client.settings import ClientSettings
    from tensorpool.observe.metrics import ConsumerCollector, ProducerCollector, start_metrics
    from tensorpool.transport.config import TransportConfig
    from tensorpool.transport.context import AeronContext

    settings = ClientSettings(transport=TransportConfig(aeron_dir=md_dir), shm_base_dir=base)
    sid = 32000 + nbytes % 997
    ctx = AeronContext(settings.transport).start()
    producer = Producer(ctx, StreamConfig.for_frame_bytes(sid, nbytes), settings)
    consumer = Consumer(ctx, sid, settings)
    touched = [0]

    def handler(frame: Any) -> None:
        arr = frame.array
        touched[0] += int(arr.reshape(-1).view(np.uint8)[::4096].sum())
        frame.is_current()

    def run_window() -> tuple[float, float]:
        """(frames/s, frames per CPU-second of the whole process, metrics thread included)."""
        n = 0
        c0 = time.process_time()
        t0 = time.perf_counter()
        end = t0 + window_s
        while True:
            for _ in range(64):
                claim = producer.claim((nbytes,), np.uint8)
                claim.array[:8] = 1
                producer.commit(claim)
                consumer.poll(handler, 64)
            n += 64
            producer.do_work()
            now = time.perf_counter()
            if now >= end:
                return n / (now - t0), n / max(time.process_time() - c0, 1e-9)

    try:
        deadline = time.monotonic() + 10
        while consumer.epoch is None and time.monotonic() < deadline:  # join the stream
            producer.do_work()
            consumer.poll(handler)
            time.sleep(0.01)
        run_window()  # warm-up
        wall: list[float] = []
        cpu: list[float] = []
        offs, ons = [], []
        for i in range(windows):
            rates: dict[bool, tuple[float, float]] = {}
            for on in (False, True) if i % 2 == 0 else (True, False):
                server = stop = t = None
                if on:
                    server = start_metrics(
                        "127.0.0.1:0", [ProducerCollector(producer), ConsumerCollector(consumer)]
                    )
                    stop = threading.Event()
                    t = threading.Thread(target=_scraper, args=([server.port], stop))
                    t.start()
                rates[on] = run_window()
                if server is not None:
                    stop.set()
                    t.join()
                    server.close()
            offs.append(rates[False][0])
            ons.append(rates[True][0])
            wall.append(rates[True][0] / rates[False][0])
            cpu.append(rates[True][1] / rates[False][1])
        # what one scrape costs, measured directly (insensitive to the host's load): the
        # exposition of every collector, process metrics included
        from prometheus_client import generate_latest

        server = start_metrics(
            "127.0.0.1:0", [ProducerCollector(producer), ConsumerCollector(consumer)]
        )
        c0 = time.process_time()
        for _ in range(200):
            generate_latest(server.registry)
        scrape_ms = (time.process_time() - c0) / 200 * 1e3
        server.close()
        return (
            statistics.median(wall),
            statistics.median(cpu),
            (min(cpu), max(cpu)),
            statistics.median(offs),
            statistics.median(ons),
            scrape_ms,
        )
    finally:
        consumer.close()
        producer.close()
        ctx.close()


def cpu_of(pid: int, seconds: float) -> float:
    c0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_s(pid) - c0) / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--windows", type=int, default=20, help="paired on/off windows")
    ap.add_argument("--window-s", type=float, default=0.5)
    ap.add_argument(
        "--part", choices=("all", "paired", "commands", "viewer"), default="all", help="one part"
    )
    a = ap.parse_args()
    parts = {"paired", "commands", "viewer"} if a.part == "all" else {a.part}
    work = tempfile.mkdtemp(prefix="tp-bench-observe-", dir="/dev/shm")
    try:
        with MediaDriverProcess() as md:
            dirs = ["--aeron-dir", md.dir, "--shm-base-dir", os.path.join(work, "shm")]
            print(f"load before: {os.getloadavg()[0]:.2f}\n")
            if "paired" in parts:
                _paired(a, md.dir, work)
            if "commands" in parts:
                _commands(a, dirs, work)
            if "viewer" in parts:
                _viewer(a, dirs)
            print(f"\nload after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _paired(a: argparse.Namespace, md_dir: str, work: str) -> None:
    print(
        "In one process, paired windows of producer+consumer frames/s "
        f"({a.windows} pairs of {a.window_s} s, scraped at 2 Hz when on):\n"
    )
    print(
        "| frame | off frames/s | on frames/s | on/off frames/s (median) "
        "| on/off frames per CPU-s (median) | min .. max | CPU per scrape |"
    )
    print("|---|---:|---:|---:|---:|---|---:|")
    for nbytes, label in ((4096, "4 KiB"), (655360, "640 KiB")):
        wall, cpu, (lo, hi), off, on, scrape_ms = paired_ab(
            md_dir, os.path.join(work, "ab"), nbytes, a.windows, a.window_s
        )
        print(
            f"| {label} | {off:,.0f} | {on:,.0f} | {wall - 1:+.1%} | {cpu - 1:+.1%} "
            f"| {lo - 1:+.1%} .. {hi - 1:+.1%} | {scrape_ms:.2f} ms |"
        )


def _commands(a: argparse.Namespace, dirs: list[str], work: str) -> None:
    print("\nCommands in separate processes (`produce --rate 0`, `consume`), medians:\n")
    print(
        "| frame | metrics | producer frames/s | consumer frames/s "
        "| producer frames per CPU-second |"
    )
    print("|---|---|---:|---:|---:|")
    sid = 30000
    for shape, label in (("4096", "4 KiB"), ("655360", "640 KiB")):
        res: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for i in range(a.repeats):
            for on in (False, True) if i % 2 == 0 else (True, False):
                sid += 1
                res[on].append(throughput(dirs, shape, a.seconds, on, sid, work))
        med = {
            on: [statistics.median(r[k] for r in res[on]) for k in range(3)] for on in (False, True)
        }
        for on in (False, True):
            p, c, e = med[on]
            print(f"| {label} | {'on' if on else 'off'} | {p:,.0f} | {c:,.0f} | {e:,.0f} |")
        ratio = [med[True][k] / med[False][k] - 1 for k in range(3)]
        print(f"| {label} | on vs off | {ratio[0]:+.1%} | {ratio[1]:+.1%} | {ratio[2]:+.1%} |")


def _viewer(a: argparse.Namespace, dirs: list[str]) -> None:
    # viewer and top at 30 Hz on the demo camera
    cam = subprocess.Popen(
        _tp("produce", *dirs, "--stream-id", "31000", "--shape", "480,640", "--rate",
            "100", "--pattern", "moving", "--quiet"),
    )  # fmt: skip
    time.sleep(2)
    print("\n| 640x480 uint16 camera at 100 Hz | CPU (share of one core) |")
    print("|---|---:|")
    print(f"| producer alone | {cpu_of(cam.pid, a.seconds):.1%} |")
    view = subprocess.Popen(
        _tp("view", *dirs, "--stream-id", "31000", "--bind", "18499"),
        stdout=subprocess.DEVNULL,
    )
    time.sleep(2)
    v_idle = cpu_of(view.pid, a.seconds)  # consuming at 30 Hz, nobody watching
    stop = threading.Event()

    def fetch() -> None:  # a browser at 30 Hz
        while not stop.wait(1 / 30):
            with contextlib.suppress(OSError):
                urllib.request.urlopen("http://127.0.0.1:18499/frame", timeout=2).read()

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(1)
    v_cpu, p_cpu = cpu_of(view.pid, a.seconds), None
    stop.set()
    t.join()
    stop_process(view)
    top = subprocess.Popen(
        _tp("top", *dirs, "--report-interval", "0.033", "--duration", str(a.seconds + 3)),
        stdout=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    t_cpu = cpu_of(top.pid, a.seconds)
    p_cpu = cpu_of(cam.pid, a.seconds)
    stop_process(top)
    stop_process(cam)
    print(f"| view, no browser (consumer at 30 Hz) | {v_idle:.1%} |")
    print(f"| view, one browser fetching at 30 Hz (JPEG) | {v_cpu:.1%} |")
    print(f"| top --report-interval 0.033 (30 Hz) | {t_cpu:.1%} |")
    print(f"| producer while top runs | {p_cpu:.1%} |")


if __name__ == "__main__":
    main()
