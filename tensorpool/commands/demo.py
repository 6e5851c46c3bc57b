"""`tensorpool demo`: frames flowing between real processes, end to end.

Starts a standalone Aeron media driver, a synthetic camera (`tensorpool produce`,
640x480 uint16 at 100 Hz with a moving pattern) and a consumer (`tensorpool
consume`) as separate processes sharing one SHM base directory, relays the
consumer's once-a-second report, then stops everything and cleans up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, help="seconds to run (%(default)s)")
    p.add_argument("--rate", type=float, default=100.0, help="camera frames/s (%(default)s)")
    p.add_argument("--shape", default="480,640", help="camera frame shape (%(default)s)")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


def run(args: argparse.Namespace) -> int:
    from tensorpool.transport.mediadriver import MediaDriverProcess

    work = tempfile.mkdtemp(
        prefix="tensorpool-demo-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    shm = os.path.join(work, "shm")
    procs: list[subprocess.Popen[bytes]] = []
    print(f"demo: media driver, camera producer and consumer under {work}", flush=True)
    try:
        with MediaDriverProcess(os.path.join(work, "aeron")) as md:
            common = ("--aeron-dir", md.dir, "--shm-base-dir", shm, "--stream-id", "1")
            procs.append(
                subprocess.Popen(
                    _cli(
                        "produce",
                        *common,
                        "--rate",
                        str(args.rate),
                        "--shape",
                        args.shape,
                        "--pattern",
                        "moving",
                        "--duration",
                        str(args.duration + 2),
                        "--quiet",
                        "--meta",
                        "instrument=demo-camera",
                    ),
                    stdin=subprocess.DEVNULL,
                )
            )
            procs.append(
                subprocess.Popen(
                    _cli("consume", *common, "--duration", str(args.duration)),
                    stdin=subprocess.DEVNULL,
                )
            )
            deadline = time.monotonic() + args.duration + 15
            while procs[1].poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            return 0 if procs[1].returncode == 0 else 1
    except KeyboardInterrupt:
        return 130
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
