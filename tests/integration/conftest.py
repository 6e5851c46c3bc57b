"""Shared fixtures: one standalone media driver per module, private SHM dirs, role processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

ROLES = str(Path(__file__).with_name("roles.py"))
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture(scope="module")
def media_driver() -> Iterator[MediaDriverProcess]:
    with MediaDriverProcess() as md:
        yield md


@pytest.fixture
def shm_base() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-test-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Role:
    """A roles.py subprocess with line-based JSON output."""

    def __init__(self, role: str, aeron_dir: str, shm_base: str, *args: str) -> None:
        cmd = [
            sys.executable,
            ROLES,
            role,
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

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def wait_event(self, name: str, timeout: float = 30.0) -> dict:
        for ev in self.events:
            if ev.get("event") == name:
                return ev
        deadline = time.monotonic() + timeout
        import select

        while time.monotonic() < deadline:
            r, _, _ = select.select([self.stdout], [], [], 0.1)
            if not r:
                if self.proc.poll() is not None:
                    break
                continue
            line = self.stdout.readline()
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

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def close(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def roles(media_driver: MediaDriverProcess, shm_base: str) -> Iterator:
    started: list[Role] = []

    def start(role: str, *args: str) -> Role:
        r = Role(role, media_driver.dir, shm_base, *args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()
