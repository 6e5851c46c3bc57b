"""Helpers shared by the Spark tests (imported as a plain module, like driver_fixtures)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np

from tensorpool.transport.mediadriver import MediaDriverProcess

SPARK_ROLES = str(Path(__file__).with_name("spark_roles.py"))
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


def check_payload(payload: bytes, seq: int) -> bool:
    """The spark_roles / roles.py checksum pattern for frame ``seq``."""
    u8 = np.frombuffer(payload, np.uint8)
    if int.from_bytes(u8[:8].tobytes(), "little") != seq:
        return False
    if int.from_bytes(u8[-8:].tobytes(), "little") != seq:
        return False
    mid = u8[8:-8]
    return bool(mid.size == 0 or (mid.min() == mid.max() == seq % 251))


class ProducerProc:
    """A spark_roles.py producer: ``produce(n)`` publishes n frames and waits for them."""

    def __init__(self, aeron_dir: str, shm_base: str, *args: str) -> None:
        cmd = [
            sys.executable,
            SPARK_ROLES,
            "--aeron-dir",
            aeron_dir,
            "--shm-base-dir",
            shm_base,
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.events: list[dict] = []
        ready = self.wait("ready")
        self.epoch: int = ready["epoch"]

    @property
    def _out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def wait(self, name: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self._out], [], [], 0.1)
            if not r:
                if self.proc.poll() is not None:
                    break
                continue
            line = self._out.readline()
            if not line:
                break
            ev = json.loads(line)
            self.events.append(ev)
            if ev.get("event") == name:
                return ev
        raise AssertionError(f"no {name!r} event (exit {self.proc.poll()}); got {self.events}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def produce(self, n: int) -> int:
        self.send(f"produce {n}")
        return int(self.wait("produced")["next_seq"])

    def produce_at(self, n: int, hz: float) -> None:
        self.send(f"rate {n} {hz}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(15)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()


def source_options(md: MediaDriverProcess, shm: str, **extra: object) -> dict[str, str]:
    opts = {"aeronDir": md.dir, "shmBaseDir": shm, "attachTimeoutMs": "20000"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts
