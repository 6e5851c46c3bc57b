"""#19 observability costs, in one run: metrics on vs off, and the viewer and `top` at 30 Hz.

1. `produce --rate 0` and `consume` flat out at 4 KiB and 640 KiB frames, alternately without
   and with `--metrics-bind` on both (scraped every 0.5 s meanwhile, 30x Prometheus' usual
   rate): producer frames/s and consumer frames/s, median of the repeats.
2. A 640x480 uint16 camera at 100 Hz; `tensorpool view` with a client fetching `/frame` at
   30 Hz, then `tensorpool top --interval 0.033`: each one's CPU (utime+stime over wall time,
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


def throughput(dirs: list[str], shape: str, seconds: float, metrics: bool, sid: int) -> tuple:
    mp, mc = 19300 + sid % 100, 19400 + sid % 100
    extra_p = ["--metrics-bind", str(mp)] if metrics else []
    extra_c = ["--metrics-bind", str(mc)] if metrics else []
    cons = subprocess.Popen(
        _tp("consume", *dirs, "--stream-id", str(sid), "--duration", str(seconds + 1.5), "--json",
            "--report-interval", "100", *extra_c),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)
    prod = subprocess.Popen(
        _tp("produce", *dirs, "--stream-id", str(sid), "--shape", shape, "--dtype", "uint8",
            "--rate", "0", "--pattern", "stamp", "--duration", str(seconds), "--json",
            "--report-interval", "100", *extra_p),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stop = threading.Event()
    t = threading.Thread(target=_scraper, args=([mp, mc] if metrics else [], stop))
    t.start()
    _, err = prod.communicate(timeout=seconds + 60)
    out, _ = cons.communicate(timeout=seconds + 60)
    stop.set()
    t.join()
    produced = int(err.strip().split()[1])  # "produced N frames on stream ..."
    final = json.loads(out.strip().splitlines()[-1])
    return produced / seconds, final["frames"] / seconds


def cpu_of(pid: int, seconds: float) -> float:
    c0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_s(pid) - c0) / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tp-bench-observe-", dir="/dev/shm")
    try:
        with MediaDriverProcess() as md:
            dirs = ["--aeron-dir", md.dir, "--shm-base-dir", os.path.join(work, "shm")]
            print(f"load before: {os.getloadavg()[0]:.2f}\n")
            print("| frame | metrics | producer frames/s | consumer frames/s |")
            print("|---|---|---:|---:|")
            sid = 30000
            for shape, label in (("4096", "4 KiB"), ("655360", "640 KiB")):
                res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                for _ in range(a.repeats):
                    for on in (False, True):
                        sid += 1
                        res[on].append(throughput(dirs, shape, a.seconds, on, sid))
                for on in (False, True):
                    p = statistics.median(r[0] for r in res[on])
                    c = statistics.median(r[1] for r in res[on])
                    print(f"| {label} | {'on' if on else 'off'} | {p:,.0f} | {c:,.0f} |")
                off_p = statistics.median(r[0] for r in res[False])
                on_p = statistics.median(r[0] for r in res[True])
                off_c = statistics.median(r[1] for r in res[False])
                on_c = statistics.median(r[1] for r in res[True])
                print(f"| {label} | on/off | {on_p / off_p - 1:+.1%} | {on_c / off_c - 1:+.1%} |")
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
                _tp("top", *dirs[2:], "--interval", "0.033", "--duration", str(a.seconds + 3)),
                stdout=subprocess.DEVNULL,
            )
            time.sleep(1.5)
            t_cpu = cpu_of(top.pid, a.seconds)
            p_cpu = cpu_of(cam.pid, a.seconds)
            stop_process(top)
            stop_process(cam)
            print(f"| view, one browser fetching at 30 Hz (JPEG) | {v_cpu:.1%} |")
            print(f"| top --interval 0.033 (30 Hz) | {t_cpu:.1%} |")
            print(f"| producer while top runs | {p_cpu:.1%} |")
            print(f"\nload after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
