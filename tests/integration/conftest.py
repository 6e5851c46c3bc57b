"""Shared fixtures: one standalone media driver per module, private SHM dirs, role processes."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from jsonlines_proc import JsonLinesProcess

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


class Role(JsonLinesProcess):
    """A roles.py subprocess with line-based JSON output."""

    def __init__(self, role: str, aeron_dir: str, shm_base: str, *args: str) -> None:
        dirs = ["--aeron-dir", aeron_dir, "--shm-base-dir", shm_base]
        super().__init__([sys.executable, ROLES, role, *dirs, *args])

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
